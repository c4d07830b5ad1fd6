"""A Tinker model on a GPU provider samples through vLLM (tests/serving/vllm_standin.py stands in
for it: vLLM needs a GPU): the official `tinker` client against a live server, the model's real
worker started with the command the control plane gives a GPU machine, the stand-in's `vllm` on
its PATH. vLLM listens on loopback alone behind a key of its own; a sample of an untrained model
asks the base model; a trained snapshot's adapter (the files a save writes) is loaded once under
its own name, old ones unloaded; the client gets vLLM's tokens and logprobs. A vLLM that fails
to start ends the model with its last lines; a machine without vLLM is a provisioning error."""

import concurrent.futures
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from tinker import types
from transformers import AutoTokenizer

from tests.conftest import REPO, fill_volume, wait_for
from tests.e2e.test_tinker import connect, supervised, tinker_key  # noqa: F401 - fixtures
from tests.e2e.test_training import TINY
from tinker_api.models import ModelStatus, OpKind, TinkerCheckpoint, TinkerModel, TinkerOperation
from tinker_api.services import checkpoints, sessions
from volumes.stores import keys as store_keys
from volumes.stores import store_for

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True, serialized_rollback=True)]
PROMPT = [5, 17, 9]


@pytest.fixture
def gpu_models(billed, settings, live_server, local_store_url, tiny_model):
    """Models run on EC2's L4 machines (their launch task never runs here: no task cluster), the
    tiny model in the volume `models`."""
    settings.VERI_STORE = local_store_url
    settings.VERI_PUBLIC_URL = live_server.url
    settings.VERI_TINKER_PROVIDER = "aws"
    settings.VERI_TINKER_GPU_TYPE = "L4-24GB"
    files = {f"tiny/{p.name}": p.read_bytes() for p in tiny_model.iterdir() if p.is_file()}
    fill_volume(billed, "models", files)


def start_worker(
    model: TinkerModel, api: str, tmp_path: Path, *, vllm: bool = True, **env
) -> subprocess.Popen:
    """The model's worker as a GPU machine's bootstrap starts it, the stand-in `vllm` on PATH
    (unless not `vllm`)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    if vllm:
        stand_in = bin_dir / "vllm"
        stand_in.write_text(
            f'#!/bin/sh\nexec {sys.executable} {REPO}/tests/serving/vllm_standin.py "$@"\n'
        )
        stand_in.chmod(0o755)
    command = sessions.worker_command(model=model, api=api)
    assert command[-2:] == ("--sampler", "vllm")
    return subprocess.Popen(
        [sys.executable, "-m", "worker", *command],
        cwd=REPO,
        env={
            **os.environ,
            "PATH": f"{bin_dir}:{os.environ['PATH']}",
            "VERI_TINKER_TOKEN": sessions.mint_token(model=model),
            "VERI_WORK_DIR": str(tmp_path / "work"),
            "VLLM_STANDIN_RECORD": str(tmp_path / "vllm.json"),
            "VLLM_STANDIN_REQUESTS": str(tmp_path / "requests.jsonl"),
            **env,
        },
    )


def requests_to(tmp_path: Path, path: str) -> list[dict]:
    lines = (tmp_path / "requests.jsonl").read_text().splitlines()
    return [r["body"] for r in map(json.loads, lines) if r["path"] == path]


def expected(n: int, max_tokens: int) -> list[tuple[list[int], list[float]]]:
    """The stand-in's answer to PROMPT (tests/serving/vllm_standin.py, `answer`)."""
    return [
        (
            [(PROMPT[-1] + 1 + i + j) % 50 for j in range(max_tokens)],
            [-(j + 1) / 4 - i / 2 for j in range(max_tokens)],
        )
        for i in range(n)
    ]


def test_a_gpu_models_samples_run_on_vllm_with_the_snapshots_adapter(
    gpu_models,
    live_server,
    connect,  # noqa: F811
    tiny_model,
    tmp_path,
):
    service = connect()
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        creating = pool.submit(
            lambda: service.create_lora_training_client(
                base_model=TINY, rank=4, seed=0, train_unembed=False
            ).result()
        )
        model = wait_for(lambda: TinkerModel.objects.first(), 60, "the model")
        worker = start_worker(model, live_server.url, tmp_path)
        try:
            training = creating.result(timeout=300)
            run(training, service, model, worker, tmp_path, tiny_model)
        finally:
            worker.kill()


def run(training, service, model, worker, tmp_path, tiny_model):
    # vLLM on loopback only, behind a random key of its own, LoRA loadable at runtime up to the
    # model's rank (4: vLLM's 8), a share of the GPU, no remote code.
    started = json.loads(wait_for(lambda: _read(tmp_path / "vllm.json"), 60, "vLLM's start"))
    args = started["argv"]
    port, key = args[args.index("--port") + 1], args[args.index("--api-key") + 1]
    assert args == [
        "serve",
        str(tmp_path / "work" / "base"),
        "--host",
        "127.0.0.1",
        "--port",
        port,
        "--api-key",
        key,
        "--served-model-name",
        "base",
        "--gpu-memory-utilization",
        "0.3",
        "--enable-lora",
        "--max-loras",
        "2",
        "--max-lora-rank",
        "8",
    ]
    assert len(key) >= 40  # secrets.token_urlsafe(32)
    assert "VLLM_ALLOW_RUNTIME_LORA_UPDATING" in started["env"]
    assert "VERI_TINKER_TOKEN" not in started["env"]  # vLLM never holds the model's token

    # Untrained (every LoRA B is zero): the base model samples, no adapter loaded.
    prompt = types.ModelInput.from_ints(PROMPT)
    params = types.SamplingParams(max_tokens=3, temperature=0.7, top_p=0.9, top_k=5, seed=11)
    base = training.save_weights_and_get_sampling_client().result()
    sequences = base.sample(prompt, 2, params).result().sequences
    assert [(s.tokens, s.logprobs) for s in sequences] == expected(2, 3)
    assert {s.stop_reason for s in sequences} == {"length"}
    url = f"http://127.0.0.1:{port}"
    assert httpx.post(f"{url}/v1/completions", json={}).status_code == 401  # no key, no answer
    [asked] = requests_to(tmp_path, "/v1/completions")
    assert asked == {
        "model": "base",
        "prompt": PROMPT,
        "n": 2,
        "max_tokens": 3,
        "temperature": pytest.approx(0.7),
        "top_p": pytest.approx(0.9),
        "top_k": 5,
        "stop": [],
        "stop_token_ids": [],
        "ignore_eos": False,
        "include_stop_str_in_output": True,
        "logprobs": 0,
        "return_tokens_as_token_ids": True,
        "seed": 11,
    }

    # Trained: a named save's weights sample with their adapter, loaded once under the
    # snapshot's name; its files are those the save uploaded.
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    training.forward_backward(supervised(tokenizer), "cross_entropy")
    training.optim_step(types.AdamParams(learning_rate=5e-2)).result()
    path = training.save_weights_for_sampler("trained").result().path
    sampler = service.create_sampling_client(model_path=path).result()
    for stop in (["\n\n", "END"], [7, 9]):
        stopping = types.SamplingParams(max_tokens=2, stop=stop, seed=1)
        [one] = sampler.sample(prompt, 1, stopping).result().sequences
        assert (one.tokens, one.logprobs) == expected(1, 2)[0]
    # With the prompt's logprobs: each prompt token's, the first's None.
    scored = sampler.sample(prompt, 1, params, include_prompt_logprobs=True).result()
    assert scored.prompt_logprobs == [None, -(1 + 17) / 8, -(2 + 9) / 8]
    save = TinkerOperation.objects.get(
        model=model, kind=OpKind.SAVE_FOR_SAMPLER, payload__name="trained"
    )
    [loaded] = requests_to(tmp_path, "/v1/load_lora_adapter")
    assert loaded["lora_name"] == f"sampler-{save.seq_id}"
    saved = TinkerCheckpoint.objects.get(operation=save)
    prefix = store_keys.workspace_prefix(saved.workspace.public_id).child(checkpoints.folder(saved))
    store = store_for(prefix)
    uploaded = {
        f["path"]: hashlib.sha256(store.get_bytes(prefix.key(f["path"]))).hexdigest()
        for f in saved.files
    }
    assert "adapter_model.safetensors" in uploaded
    assert loaded["files"] == uploaded
    asked = requests_to(tmp_path, "/v1/completions")[1:]
    assert [a["model"] for a in asked] == [loaded["lora_name"]] * 3
    assert [(a["stop"], a["stop_token_ids"]) for a in asked[:2]] == [
        (["\n\n", "END"], []),
        ([], [7, 9]),
    ]
    assert [a.get("prompt_logprobs") for a in asked] == [None, None, 0]

    # Two more snapshots: the oldest adapter is unloaded (two stay loaded), its folder removed.
    for _ in range(2):
        newer = training.save_weights_and_get_sampling_client().result()
        newer.sample(prompt, 1, types.SamplingParams(max_tokens=1)).result()
    names = [b["lora_name"] for b in requests_to(tmp_path, "/v1/load_lora_adapter")]
    assert len(set(names)) == 3
    assert requests_to(tmp_path, "/v1/unload_lora_adapter") == [{"lora_name": names[0]}]
    assert not Path(loaded["lora_path"]).exists()

    # The session closed, the worker exits and vLLM with it.
    service.close("success").result()
    assert worker.wait(120) == 0
    with pytest.raises(ProcessLookupError):
        os.kill(started["pid"], 0)


def _read(path: Path) -> str | None:
    return path.read_text() if path.exists() and path.stat().st_size else None


def worker_fails(service, api: str, tmp_path: Path, **worker_kwargs) -> TinkerModel:
    """A new model whose worker (started with `worker_kwargs`) exits 1 before it is ready."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pool.submit(
            lambda: service.create_lora_training_client(
                base_model=TINY, rank=4, train_unembed=False
            )
        )
        model = wait_for(lambda: TinkerModel.objects.first(), 60, "the model")
        worker = start_worker(model, api, tmp_path, **worker_kwargs)
        try:
            assert worker.wait(300) == 1
        finally:
            worker.kill()
    model.refresh_from_db()
    return model


def test_a_vllm_that_fails_to_start_ends_the_model_with_its_last_lines(
    gpu_models,
    live_server,
    connect,  # noqa: F811
    tmp_path,
):
    refusal = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
    model = worker_fails(connect(), live_server.url, tmp_path, VLLM_STANDIN_REFUSE=refusal)
    assert (model.status, model.error_code) == (ModelStatus.FAILED, "worker_failed")
    assert "vLLM exited with status 1 while starting" in model.error_message
    assert refusal in model.error_message  # its last lines


def test_a_gpu_machine_without_vllm_ends_the_model_as_a_provisioning_error(
    gpu_models,
    live_server,
    connect,  # noqa: F811
    tmp_path,
):
    model = worker_fails(connect(), live_server.url, tmp_path, vllm=False)
    assert (model.status, model.error_code) == (ModelStatus.FAILED, "provisioning_error")
    assert "vLLM is not installed" in model.error_message
