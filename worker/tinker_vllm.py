"""A Tinker model's sampler on a GPU machine (`python -m worker tinker … --sampler vllm`): vLLM's
OpenAI-compatible server, started once for the model's worker next to the training model, as a
deployment's replica starts it (worker/serve_vllm.py: the same launcher, the same output tail
when it fails), but on loopback only, behind a random key of its own, with LoRA adapters loaded
at runtime. The machine's bootstrap installs vLLM as it does for a replica.

A sample at a weights snapshot writes that snapshot's LoRA adapter (PEFT's files, written by the
model's own `save`), loads it into vLLM under the snapshot's name once, and asks `/v1/completions`
with the prompt's token ids; weights that compute the base model exactly (an untrained LoRA, a
base model's sampler) sample the base model, no adapter loaded. Logprobs are vLLM's, not the
training forward pass's: importance_sampling and ppo use the sampler's, as Tinker's do."""

import secrets
import shutil
import socket
import time
from collections import OrderedDict
from pathlib import Path

import httpx

from worker import serve_vllm
from worker.tinker_losses import LossInputError
from worker.tinker_model import stops

BASE_NAME = "base"  # what vLLM serves the base model as; adapters are `sampler-<seq_id>`
# vLLM's share of the GPU (weights, activations and KV cache). The training model holds the base
# in float32 (twice vLLM's bfloat16 copy) plus the LoRA's gradients, AdamW state and a forward
# pass's activations; it is loaded first, and vLLM refuses to start when less than its share is
# free, so the training side keeps the larger part: 0.3 leaves 70% to it.
GPU_SHARE = 0.3
# Adapters kept loaded: the newest snapshot and the one before (an RL loop may still sample it);
# older ones are unloaded, and loaded again if a sample asks for them.
KEEP_ADAPTERS = 2
START_SECONDS = 1800  # for vLLM to load the base model and answer /health
REQUEST_SECONDS = 3600  # for one sample request (up to 64 sequences of 4096 tokens)
TOKEN_ID = "token_id:"  # how vLLM names a token with return_tokens_as_token_ids
STOP_REASONS = {"stop": "stop", "length": "length"}


class EngineFailed(Exception):
    """vLLM is gone or never came up: the model ends with `code` and this message."""

    def __init__(self, message: str, code: str = "worker_failed"):
        super().__init__(message)
        self.code = code


def loopback_port() -> int:
    """A port free on loopback now (the OS's pick), for vLLM to bind."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def command(*, base: str | Path, rank: int, port: int, key: str) -> list[str]:
    """`vllm serve` for the base model (a folder, or a hub id vLLM fetches) on loopback alone,
    LoRA enabled up to the model's rank; never with `--trust-remote-code`."""
    return [
        "vllm",
        "serve",
        str(base),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--api-key",
        key,
        "--served-model-name",
        BASE_NAME,
        "--gpu-memory-utilization",
        str(GPU_SHARE),
        "--enable-lora",
        "--max-loras",
        str(KEEP_ADAPTERS),
        "--max-lora-rank",
        str(serve_vllm.fitting_rank(rank)),
    ]


def completion_request(model: str, payload: dict) -> dict:
    """A sample operation's payload as vLLM's `/v1/completions` body. Tinker's `stop` is strings
    or token ids, `[]` stops nothing (not even end-of-sequence), and the sequence keeps the stop
    text it ended with, as the transformers sampler's does."""
    params = payload["sampling_params"]
    stop_ids, stop_texts, eos_stops = stops(params)
    top_k = int(params.get("top_k", -1))
    body = {
        "model": model,
        "prompt": payload["tokens"],
        "n": int(payload["num_samples"]),
        "max_tokens": int(params.get("max_tokens") or 16),
        "temperature": float(params.get("temperature", 1.0)),
        "top_p": float(params.get("top_p", 1.0)),
        "top_k": top_k if top_k > 0 else -1,
        "stop": stop_texts,
        "stop_token_ids": stop_ids,
        "ignore_eos": not eos_stops,
        "include_stop_str_in_output": True,
        "logprobs": 0,  # the sampled token's alone
        "return_tokens_as_token_ids": True,
    }
    if params.get("seed") is not None:
        body["seed"] = int(params["seed"])
    if payload.get("prompt_logprobs"):
        body["prompt_logprobs"] = 0  # each prompt token's own
    return body


def sequence(choice: dict) -> dict:
    """One completion choice as the sample result's `{tokens, logprobs, stop_reason}`."""
    logprobs = choice.get("logprobs") or {}
    names, values = logprobs.get("tokens") or [], logprobs.get("token_logprobs") or []
    if not all(isinstance(n, str) and n.startswith(TOKEN_ID) for n in names):
        raise ValueError("vLLM answered tokens that are not token ids")
    if len(values) != len(names) or not all(isinstance(v, int | float) for v in values):
        raise ValueError("vLLM answered no logprob for a token")
    reason = STOP_REASONS.get(choice.get("finish_reason"))
    if reason is None:
        raise ValueError(f"vLLM ended a sequence for {choice.get('finish_reason')!r}")
    tokens = [int(n.removeprefix(TOKEN_ID)) for n in names]
    return {"tokens": tokens, "logprobs": [float(v) for v in values], "stop_reason": reason}


def prompt_logprobs(tokens: list[int], choice: dict) -> list[float | None]:
    """Each prompt token's logprob from a choice's `prompt_logprobs` (per position, None or
    `{token id: {logprob, …}}` holding the prompt's own token); the first's None."""
    scored = choice.get("prompt_logprobs") or []
    if len(scored) != len(tokens):
        raise ValueError("vLLM answered no logprob for a prompt token")
    pairs = zip(tokens[1:], scored[1:], strict=True)
    return [None, *(float(at[str(token)]["logprob"]) for token, at in pairs)]


class VllmSampler:
    """vLLM's server for `model` (a worker.tinker_model.TinkerModel), started at once; a
    sample waits for it to answer. A sampler that has no snapshot (the worker restarted after its
    save) samples the weights as they are when first asked, kept from then on."""

    def __init__(self, model, *, rank: int, work: Path):
        if shutil.which("vllm") is None:  # the bootstrap's install went missing
            raise EngineFailed("vLLM is not installed (no `vllm` on PATH).", "provisioning_error")
        self.model = model
        self.folder = work / "sampler"
        key = secrets.token_urlsafe(32)
        port = loopback_port()
        self.url = f"http://127.0.0.1:{port}"
        self.server = serve_vllm.Server(
            command(base=model.base_path, rank=rank, port=port, key=key),
            key=key,
            env={"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"},  # load_lora_adapter
        )
        self.http = httpx.Client(
            base_url=self.url, headers={"Authorization": f"Bearer {key}"}, timeout=REQUEST_SECONDS
        )
        self.ready = False
        self.loaded: OrderedDict[int, str] = OrderedDict()  # snapshot seq_id → name, oldest first

    def failure(self) -> str | None:
        """Why vLLM is gone, once it exited."""
        if not self.server.exited():
            return None
        return self.server.failure("after sampling" if self.ready else "while starting")

    def sample(self, seq_id: int, payload: dict) -> dict:
        self.model.check_prompt(payload["tokens"])
        self._wait_ready()
        if seq_id not in self.model.snapshots:
            self.model.snapshot(seq_id)
        name = BASE_NAME if self.model.snapshot_is_base(seq_id) else self._adapter(seq_id)
        answer = self._post("/v1/completions", completion_request(name, payload))
        choices = sorted(answer.get("choices") or (), key=lambda c: c.get("index", 0))
        if len(choices) != int(payload["num_samples"]):
            raise ValueError(f"vLLM answered {len(choices)} sequences")
        result = {"sequences": [sequence(choice) for choice in choices]}
        if payload.get("prompt_logprobs"):
            result["prompt_logprobs"] = prompt_logprobs(payload["tokens"], choices[0])
        return result

    def stop(self) -> None:
        self.http.close()
        self.server.stop()

    def started(self) -> bool:
        """Whether vLLM answers (asked again each time until it has)."""
        if not self.ready and serve_vllm.healthy(self.url):
            self.ready = True
            print(f"[veri] vLLM samples on {self.url}", flush=True)
        return self.ready

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + START_SECONDS
        while not self.started():
            if message := self.failure():
                raise EngineFailed(message)
            if time.monotonic() >= deadline:
                self.server.stop()
                silent = f"after {START_SECONDS} s without answering"
                raise EngineFailed(self.server.failure(silent))
            time.sleep(serve_vllm.POLL_SECONDS)

    def _adapter(self, seq_id: int) -> str:
        """The name of the snapshot's adapter in vLLM, written and loaded the first time."""
        if seq_id in self.loaded:
            self.loaded.move_to_end(seq_id)
            return self.loaded[seq_id]
        name = f"sampler-{seq_id}"
        folder = self.folder / name
        with self.model.snapshot_weights(seq_id):
            self.model.save(folder, optimizer=False)
        self._post("/v1/load_lora_adapter", {"lora_name": name, "lora_path": str(folder)})
        self.loaded[seq_id] = name
        while len(self.loaded) > KEEP_ADAPTERS:
            _, old = self.loaded.popitem(last=False)
            self._post("/v1/unload_lora_adapter", {"lora_name": old})
            shutil.rmtree(self.folder / old, ignore_errors=True)
        return name

    def _post(self, path: str, body: dict) -> dict:
        """vLLM's answer; a sample it refuses (a prompt past the model's context, say) fails that
        request alone; vLLM gone fails the model."""
        try:
            response = self.http.post(path, json=body)
        except httpx.HTTPError as exc:
            time.sleep(1)  # a crash's connection reset comes before its exit
            raise EngineFailed(self.failure() or f"vLLM did not answer {path}: {exc}") from exc
        if response.status_code == 400 and path == "/v1/completions":
            raise LossInputError(f"vLLM refused the sample: {_detail(response)}")
        if response.status_code != 200:
            status = response.status_code
            raise RuntimeError(f"vLLM answered {path} with {status}: {_detail(response)}")
        return response.json() if path == "/v1/completions" else {}


def _detail(response: httpx.Response) -> str:
    try:
        return str(response.json().get("error", {}).get("message") or response.text)[:2000]
    except (ValueError, AttributeError):
        return response.text[:2000]
