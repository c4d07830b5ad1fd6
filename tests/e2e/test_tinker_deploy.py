"""A state the official `tinker` SDK saved is a Veri checkpoint: its `tinker://` path deploys
as an adapter on the Tinker model's base, and the official `openai` client's greedy answer from
that deployment is what transformers + PEFT answer with the downloaded adapter."""

import openai
import pytest
import tinker
from tinker import types
from transformers import AutoTokenizer

from tests.conftest import assert_error
from tests.e2e.test_serving import QUESTION, ask, deploy, peft_greedy
from tests.e2e.test_tinker import stop_models, tinker_key  # noqa: F401 - fixtures
from tests.e2e.test_tinker_checkpoints import download_adapter
from tests.e2e.test_training import TINY, platform  # noqa: F401 - a fixture
from tests.openai_api.conftest import openai_client
from training.models import Checkpoint

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True, serialized_rollback=True)]

STEPS = 20
ANSWER = [{"role": "assistant", "content": "plum plum plum is a fruit."}]


def chat_datum(tokenizer) -> types.Datum:
    """QUESTION answered with ANSWER in the model's chat template, only the answer's tokens
    weighted: what a deployment's chat completion then says."""
    chat = tokenizer.apply_chat_template
    prompt = len(chat(QUESTION, add_generation_prompt=True, return_dict=True)["input_ids"])
    ids = chat(QUESTION + ANSWER, return_dict=True)["input_ids"]
    weights = [0.0 if i < prompt - 1 else 1.0 for i in range(len(ids) - 1)]
    return types.Datum(
        model_input=types.ModelInput.from_ints(ids[:-1]),
        loss_fn_inputs={"target_tokens": ids[1:], "weights": weights},
    )


def test_a_tinker_save_deploys_and_the_openai_client_gets_what_peft_answers(
    platform,  # noqa: F811
    live_server,
    api_client,
    workspace,
    other_api_client,
    tinker_key,  # noqa: F811
    tiny_model,
    stop_models,  # noqa: F811
    tmp_path,
):
    platform()
    service = tinker.ServiceClient(base_url=live_server.url, api_key=tinker_key)
    training = service.create_lora_training_client(base_model=TINY, rank=8, seed=0).result()
    datum = chat_datum(AutoTokenizer.from_pretrained(tiny_model))
    losses = []
    for _ in range(STEPS):
        backward = training.forward_backward([datum], "cross_entropy")
        training.optim_step(types.AdamParams(learning_rate=5e-2)).result()
        losses.append(backward.result().metrics["loss:sum"])
    assert losses[-1] < 0.2 * losses[0], losses  # it learnt the answer
    path = training.save_state("plum").result().path
    assert path == f"tinker://{training.model_id}/weights/plum"

    # Its adapter is a Veri checkpoint of the workspace, on the Tinker model's base.
    checkpoint = Checkpoint.objects.get(workspace=workspace)
    assert (checkpoint.job, checkpoint.adapter_base, checkpoint.step) == (None, TINY, STEPS)
    assert sorted(f["path"] for f in checkpoint.files) == [
        "adapter_config.json",
        "adapter_model.safetensors",
    ]

    # Another workspace can neither deploy it nor call it.
    refused = other_api_client.post("/v1/deployments", {"adapters": [path]}, format="json")
    assert_error(refused, 400, "model_not_found", "adapters.0")

    deployment = deploy(api_client, adapters=[path], idle_timeout_seconds=600)
    assert deployment["base_model"] == TINY
    assert deployment["adapters"] == [{"name": path, "checkpoint_id": checkpoint.public_id}]

    base_text, adapter_text = peft_greedy(
        tiny_model, download_adapter(live_server, tinker_key, path, tmp_path)
    )
    assert base_text != adapter_text  # the trained adapter changes the greedy answer
    client = openai_client(live_server, api_client.raw_key)
    answer = ask(client, path)
    assert answer.model == path and answer.choices[0].message.content == adapter_text
    assert ask(client, TINY).choices[0].message.content == base_text  # the base, same replica
    with pytest.raises(openai.NotFoundError):
        ask(openai_client(live_server, other_api_client.raw_key), path)
