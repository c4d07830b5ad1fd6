"""A checkpoint the `tinker` SDK saved on a real worker is listed by its rest client, and its
adapter, downloaded as an archive, is what the model computes with: PEFT loads it onto the base
model and gives the logprobs the Tinker model gave."""

import io
import tarfile
from pathlib import Path

import httpx
import pytest
import tinker
import torch
from peft import PeftModel
from tinker import types
from transformers import AutoModelForCausalLM

from tests.e2e.test_tinker import connect, stop_models, tinker_key  # noqa: F401 - fixtures
from tests.e2e.test_training import TINY, platform  # noqa: F401 - a fixture

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True, serialized_rollback=True)]


def download_adapter(live_server, key: str, path: str, into: Path) -> Path:
    """The adapter of the saved state at `path` (`tinker://<model>/weights/<name>`), through the
    archive route the tinker CLI downloads with, extracted: the folder PEFT loads."""
    model_id, _, checkpoint = path.removeprefix("tinker://").partition("/")
    redirect = httpx.get(
        f"{live_server.url}/api/v1/training_runs/{model_id}/checkpoints/{checkpoint}/archive",
        headers={"X-API-Key": key},
    )
    assert redirect.status_code == 302, redirect.text
    archive = httpx.get(redirect.headers["Location"])
    with tarfile.open(fileobj=io.BytesIO(archive.content)) as tar:
        tar.extractall(into, filter="data")
    return into / checkpoint.removeprefix("weights/")


def test_a_saved_state_is_listed_and_its_adapter_downloads_and_loads_in_peft(
    platform,  # noqa: F811
    live_server,
    tinker_key,  # noqa: F811
    connect,  # noqa: F811
    tiny_model,
    stop_models,  # noqa: F811
    tmp_path,
):
    platform()
    service = connect()
    training = service.create_lora_training_client(base_model=TINY, rank=4, seed=0).result()
    tokens = [5, 9, 3, 7, 11, 2]
    datum = types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={"target_tokens": tokens[1:]},
    )
    for _ in range(2):  # move the LoRA away from its zero start
        training.forward_backward([datum], "cross_entropy").result()
        training.optim_step(types.AdamParams(learning_rate=5e-2)).result()
    saved = training.save_state("trained").result()
    logprobs = training.forward([datum], "cross_entropy").result()
    expected = logprobs.loss_fn_outputs[0]["logprobs"].tolist()

    rest = tinker.RestClient(base_url=live_server.url, api_key=tinker_key)
    [listed] = rest.list_checkpoints(training.model_id).result().checkpoints
    assert listed.tinker_path == saved.path and listed.size_bytes > 0

    model = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(tiny_model, torch_dtype=torch.float32),
        download_adapter(live_server, tinker_key, saved.path, tmp_path),
    ).eval()
    with torch.no_grad():
        logits = model(torch.tensor([tokens[:-1]])).logits[0].float()
    got = torch.log_softmax(logits, -1)[torch.arange(len(tokens) - 1), torch.tensor(tokens[1:])]
    assert got.tolist() == pytest.approx(expected, abs=1e-3)
