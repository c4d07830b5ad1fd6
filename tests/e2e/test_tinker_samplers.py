"""Named sampler weights outlive their model: sampled greedily while the training client's
session is open, then, that session closed, by a new client's sampling client of the same path
(a sampling-only model whose worker loads the adapter the save kept in the store): the same
tokens and logprobs. A sample's prompt logprobs are a forward pass's."""

import pytest
from tinker import types
from transformers import AutoTokenizer

from tests.e2e.test_tinker import (  # noqa: F401 - fixtures
    connect,
    stop_models,
    supervised,
    tinker_key,
)
from tests.e2e.test_training import TINY, platform  # noqa: F401 - a fixture
from tinker_api.models import ModelStatus, TinkerModel

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True, serialized_rollback=True)]


def test_named_sampler_weights_sample_the_same_after_their_session_closed(
    platform,  # noqa: F811
    connect,  # noqa: F811
    tiny_model,
    stop_models,  # noqa: F811
):
    platform()
    service = connect()
    training = service.create_lora_training_client(base_model=TINY, rank=4, seed=0).result()
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    for _ in range(2):  # a LoRA that is not 0
        training.forward_backward(supervised(tokenizer), "cross_entropy")
        training.optim_step(types.AdamParams(learning_rate=5e-2)).result()
    path = training.save_weights_for_sampler("eval").result().path
    prompt = types.ModelInput.from_ints(tokenizer("the answer is")["input_ids"])
    greedy = types.SamplingParams(max_tokens=6, temperature=0, seed=3, stop=[])
    sampler = service.create_sampling_client(model_path=path).result()
    [before] = sampler.sample(prompt, 1, greedy).result().sequences
    # The prompt's logprobs, when asked, are those a forward pass of the same weights gives.
    scored = sampler.sample(prompt, 1, greedy, include_prompt_logprobs=True).result()
    ids = prompt.to_ints()
    datum = types.Datum(
        model_input=types.ModelInput.from_ints(ids[:-1]), loss_fn_inputs={"target_tokens": ids[1:]}
    )
    forward = training.forward([datum], "cross_entropy").result().loss_fn_outputs[0]
    assert scored.prompt_logprobs[0] is None
    assert scored.prompt_logprobs[1:] == pytest.approx(forward["logprobs"].tolist(), abs=1e-4)
    service.close("success").result()

    again = connect()
    later = again.create_sampling_client(model_path=path).result()
    [after] = later.sample(prompt, 1, greedy).result().sequences
    assert after.tokens == before.tokens
    assert after.logprobs == pytest.approx(before.logprobs, abs=1e-4)
    trained = TinkerModel.objects.get(model_id=training.model_id)
    loaded = TinkerModel.objects.get(user_metadata__veri_sampler=path)
    assert trained.status != ModelStatus.READY and loaded.status == ModelStatus.READY
    assert loaded.session != trained.session
    # The saved weights are a checkpoint of type `sampler`, as the rest client lists them
    # (beside the state the model saved as its session closed).
    listed = again.create_rest_client().list_checkpoints(training.model_id).result().checkpoints
    assert [c.tinker_path for c in listed if c.checkpoint_type == "sampler"] == [path]
