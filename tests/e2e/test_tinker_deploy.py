"""A state the official `tinker` SDK saved is a Veri checkpoint: its `tinker://` path deploys
as an adapter on the Tinker model's base, and the official `openai` client's greedy answer from
that deployment is what transformers + PEFT answer with the downloaded adapter; a managed job
named by that path trains on from the adapter."""

import openai
import pytest
from tinker import types
from transformers import AutoTokenizer

from tests.conftest import assert_error
from tests.e2e.test_serving import QUESTION, ask, deploy, peft_greedy
from tests.e2e.test_tinker import connect, stop_models, tinker_key  # noqa: F401 - fixtures
from tests.e2e.test_tinker_checkpoints import download_adapter
from tests.e2e.test_training import TINY, platform, submit, wait_settled  # noqa: F401
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


def train_and_save(training, datum: types.Datum, steps: int) -> str:
    """`steps` × (forward_backward + optim_step) on `datum`, then `save_state("plum")`: its path."""
    losses = []
    for _ in range(steps):
        backward = training.forward_backward([datum], "cross_entropy")
        training.optim_step(types.AdamParams(learning_rate=2e-2)).result()
        losses.append(backward.result().metrics["loss:sum"])
    assert losses[-1] < 0.5 * losses[0], losses  # it learnt the answer
    return training.save_state("plum").result().path


def test_a_tinker_save_deploys_and_the_openai_client_gets_what_peft_answers(
    platform,  # noqa: F811
    live_server,
    api_client,
    workspace,
    other_api_client,
    tinker_key,  # noqa: F811
    connect,  # noqa: F811
    tiny_model,
    stop_models,  # noqa: F811
    tmp_path,
):
    platform()
    service = connect()
    datum = chat_datum(AutoTokenizer.from_pretrained(tiny_model))
    training = service.create_lora_training_client(base_model=TINY, rank=8, seed=0).result()
    path = train_and_save(training, datum, STEPS)
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

    # A managed job named by the path trains on from the adapter, on the Tinker model's base;
    # not from this one, which covers the LM head (Tinker's default train_unembed): the trainers
    # cannot, and submit says so before anything is rented.
    rows = [{"messages": QUESTION + ANSWER}] * 8
    job = {
        "method": "sft_text",
        "hyperparameters": {"max_steps": 2, "batch_size": 4, "max_seq_length": 64},
    }
    refused = api_client.post(
        "/v1/training_jobs", {"base_model": path, "dataset_id": "ds_x", **job}, format="json"
    )
    assert "train_unembed=False" in assert_error(refused, 400, "invalid_base_model")["message"]
    body = service.create_lora_training_client(
        base_model=TINY, rank=8, seed=0, train_unembed=False
    ).result()
    body_path = train_and_save(body, datum, 4)
    job_id = submit(api_client, rows, base_model=body_path, **job)
    job = wait_settled(job_id)
    assert job.status == "completed", (job.error_code, job.error_message)
    adapter = Checkpoint.objects.get(tinker_save__model__model_id=body.model_id)
    assert (job.base_model, job.adapter_from) == (TINY, adapter)
    log = api_client.get(f"/v1/training_jobs/{job_id}/logs/full").getvalue().decode()
    assert f"training on from the adapter of {adapter.public_id}" in log
