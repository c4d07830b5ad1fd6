"""The official `tinker` SDK, unmodified, trains on Veri: its base URL pointed at a live server
with a task cluster and the local provider, a Tinker key the API issued, the tiny model in a
volume. A supervised loop of 20 forward_backward + optim_step steps lowers the loss; what Veri
does not support yet is an error the client raises."""

import pytest
import tinker
from tinker import types
from transformers import AutoTokenizer

from providers.local import LocalProvider
from tests.e2e.test_training import TINY, platform  # noqa: F401 - a fixture
from tinker_api.models import ModelStatus, TinkerModel

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True, serialized_rollback=True)]

LINES = ["the cat sat on the mat.", "a plum is a fruit.", "apples are red or green."]


@pytest.fixture
def tinker_key(api_client) -> str:
    response = api_client.post("/v1/tinker/keys", {"name": "e2e"}, format="json")
    assert response.status_code == 201, response.json()
    return response.json()["key"]


@pytest.fixture
def stop_models():
    yield
    for model in TinkerModel.objects.exclude(external_id=""):
        LocalProvider().terminate(model.external_id)


def supervised(tokenizer) -> list[types.Datum]:
    """Each line as next-token prediction, the first token's prediction weighted 0."""
    data = []
    for line in LINES:
        ids = tokenizer(line)["input_ids"] + [tokenizer.eos_token_id]
        weights = [0.0] + [1.0] * (len(ids) - 2)
        data.append(
            types.Datum(
                model_input=types.ModelInput.from_ints(ids[:-1]),
                loss_fn_inputs={"target_tokens": ids[1:], "weights": weights},
            )
        )
    return data


def test_a_supervised_loop_lowers_the_loss(
    platform,  # noqa: F811
    live_server,
    tinker_key,
    tiny_model,
    stop_models,
):
    platform()
    service = tinker.ServiceClient(base_url=live_server.url, api_key=tinker_key)
    training = service.create_lora_training_client(base_model=TINY, rank=8, seed=0).result()
    assert training.get_info().lora_rank == 8
    data = supervised(AutoTokenizer.from_pretrained(tiny_model))
    losses = []
    for _ in range(20):
        backward = training.forward_backward(data, "cross_entropy")
        step = training.optim_step(types.AdamParams(learning_rate=2e-2))
        result = backward.result()
        step.result()
        losses.append(result.metrics["loss:sum"])
        [first] = result.loss_fn_outputs[:1]
        assert len(first["logprobs"].tolist()) == len(data[0].model_input.to_ints())
    assert losses[-1] < 0.7 * losses[0], losses
    after = training.forward(data, "cross_entropy").result().metrics["loss:sum"]
    assert after < losses[-1], (after, losses)

    # What Veri does not support yet is an error the client raises, not a hang or a 500.
    with pytest.raises(tinker.BadRequestError, match="does not support"):
        service.create_sampling_client(base_model=TINY).result()
    with pytest.raises(tinker.RequestFailedError, match="not supported"):
        training.forward_backward(data, "dro").result()
    model = TinkerModel.objects.get()
    assert (model.status, model.base_model) == (ModelStatus.READY, TINY)
