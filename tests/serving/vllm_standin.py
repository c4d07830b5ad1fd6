"""A stand-in for `vllm serve` (GPU-only) in the launcher's tests: it writes down how it was started
(VLLM_STANDIN_RECORD), then serves `/health` and `/v1/chat/completions` (streamed, naming the
model it was asked for) on the --host and --port it was given, after a second of "loading"; as
vLLM with `--api-key`, every `/v1` request must bear it (`Authorization: Bearer`), else 401.

As a Tinker model's sampler uses it: `/v1/completions` answers, for the served model or a loaded
adapter, `n` choices of `max_tokens` tokens (as `token_id:N`, with `return_tokens_as_token_ids`)
and logprobs, a function of the prompt alone (`answer` below), and its `prompt_logprobs` when
asked; `/v1/load_lora_adapter` (only
with VLLM_ALLOW_RUNTIME_LORA_UPDATING and `--enable-lora`, as vLLM) checks the adapter's rank
against --max-lora-rank, and `/v1/unload_lora_adapter` forgets it. Each of those requests is
appended to VLLM_STANDIN_REQUESTS (JSON lines), a loaded adapter with its files' SHA-256.

VLLM_STANDIN_REFUSE=TEXT: print a traceback ending in TEXT and exit 1 while loading, as vLLM does
with a model it cannot load. A chat request for the model `crash` prints a CUDA error and exits 1,
as vLLM crashing while it serves."""

import hashlib
import json
import os
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

argv = sys.argv[1:]
if "VLLM_STANDIN_RECORD" in os.environ:
    with open(os.environ["VLLM_STANDIN_RECORD"], "w") as record:
        json.dump({"argv": argv, "pid": os.getpid(), "env": sorted(os.environ)}, record)
print("INFO Starting vLLM API server (stand-in)", flush=True)
time.sleep(1)
if refusal := os.environ.get("VLLM_STANDIN_REFUSE"):
    print("Traceback (most recent call last):", file=sys.stderr)
    print('  File "vllm/model_executor/model_loader.py", line 1', file=sys.stderr)
    print(f"ValueError: {refusal}", file=sys.stderr, flush=True)
    sys.exit(1)
host, port = argv[argv.index("--host") + 1], int(argv[argv.index("--port") + 1])
key = argv[argv.index("--api-key") + 1]
served = argv[argv.index("--served-model-name") + 1] if "--served-model-name" in argv else argv[1]
runtime_lora = os.environ.get("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "").lower() in ("true", "1")
max_rank = int(argv[argv.index("--max-lora-rank") + 1]) if "--enable-lora" in argv else 0
adapters: dict[str, str] = {}  # loaded at runtime: name → path


def answer(body: dict) -> dict:
    """Choice i's token j is (the prompt's last token + 1 + i + j) % 50, its logprob
    -(j + 1) / 4 - i / 2: exact in float32, as the Tinker client carries them."""
    last = body["prompt"][-1]
    choices = []
    for i in range(body.get("n", 1)):
        ids = [(last + 1 + i + j) % 50 for j in range(body["max_tokens"])]
        logprobs = {
            "tokens": [f"token_id:{t}" for t in ids],
            "token_logprobs": [-(j + 1) / 4 - i / 2 for j in range(len(ids))],
            "top_logprobs": [None] * len(ids),
            "text_offset": list(range(len(ids))),
        }
        choices.append({"index": i, "text": "", "logprobs": logprobs, "finish_reason": "length"})
    if body.get("prompt_logprobs") is not None:  # the prompt token t at position p: -(p + t) / 8
        scored = [None] + [
            {str(t): {"logprob": -(p + t) / 8}} for p, t in enumerate(body["prompt"])
        ][1:]
        for choice in choices:
            choice["prompt_logprobs"] = scored
    return {"object": "text_completion", "model": body["model"], "choices": choices}


def requested(path: str, body: dict) -> None:
    if "VLLM_STANDIN_REQUESTS" in os.environ:
        with open(os.environ["VLLM_STANDIN_REQUESTS"], "a") as out:
            out.write(json.dumps({"path": path, "body": body}) + "\n")


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"

    def log_message(self, format, *args):  # noqa: A002 - the base class's name
        pass

    def do_GET(self):  # noqa: N802 - the base class's name
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()

    def reply(self, status: int, body) -> None:
        data = json.dumps(body).encode() if isinstance(body, dict) else body.encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def error(self, status: int, message: str) -> None:
        self.reply(status, {"error": {"message": message, "code": status}})

    def do_POST(self):  # noqa: N802 - the base class's name
        if self.headers.get("Authorization") != f"Bearer {key}":
            self.send_response(401)
            self.end_headers()
            return
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path == "/v1/completions":
            requested(self.path, body)
            if body["model"] != served and body["model"] not in adapters:
                return self.error(404, f"The model `{body['model']}` does not exist.")
            return self.reply(200, answer(body))
        if self.path in ("/v1/load_lora_adapter", "/v1/unload_lora_adapter") and runtime_lora:
            return self.lora(body)
        if self.path != "/v1/chat/completions":
            return self.error(404, "Not Found")
        if body["model"] == "crash":
            print("RuntimeError: CUDA error: an illegal memory access", file=sys.stderr)
            sys.stderr.flush()
            os._exit(1)
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for word in ("served by ", body["model"]):
            chunk = {"object": "chat.completion.chunk", "choices": [{"delta": {"content": word}}]}
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
            self.wfile.flush()
        self.wfile.write(b"data: [DONE]\n\n")

    def lora(self, body: dict) -> None:
        name = body.get("lora_name")
        if self.path == "/v1/unload_lora_adapter":
            requested(self.path, body)
            if adapters.pop(name, None) is None:
                return self.error(404, f"The lora adapter '{name}' cannot be found.")
            return self.reply(200, f"Success: LoRA adapter '{name}' removed successfully.")
        folder = Path(body.get("lora_path") or "")
        files = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.glob("*")}
        requested(self.path, body | {"files": files})
        if not max_rank:
            return self.error(400, "LoRA is not enabled.")
        if name in adapters:
            return self.error(400, f"The lora adapter '{name}' has already been loaded.")
        rank = json.loads((folder / "adapter_config.json").read_text())["r"]
        if rank > max_rank:
            return self.error(400, f"LoRA rank {rank} is greater than max_lora_rank {max_rank}.")
        adapters[name] = str(folder)
        return self.reply(200, f"Success: LoRA adapter '{name}' added successfully.")


ThreadingHTTPServer((host, port), Handler).serve_forever()
