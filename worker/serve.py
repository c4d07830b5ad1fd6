"""`python -m worker serve --replica ID --api URL` (the replica token in VERI_REPLICA_TOKEN, its
serving key, which every request must bear, in VERI_SERVING_KEY): a
deployment's serving process on the embedded default, on transformers + PEFT on CPU. It
registers, fetches the base model and each adapter from the presigned URLs its spec gives,
loads them, answers OpenAI's `/v1/chat/completions` and `/v1/completions` (streaming too) on a
loopback port it reports, and heartbeats until the control plane says its replica stopped.

One request is generated at a time (a lock around the model): a small CPU server, not a batching
one. On a rented GPU machine (`--engine vllm`) the same fetched files are served by vLLM instead
(worker/serve_vllm.py)."""

import hmac
import json
import os
import sys
import threading
import time
import traceback
import uuid
from collections.abc import Iterator
from contextlib import nullcontext
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx

from worker.client import ControlPlane, download, heartbeat
from worker.openai_requests import BadRequest, Generation, parse

MAX_BODY_BYTES = 4 * 1024**2
ROUTES = {"/v1/chat/completions": "chat", "/v1/completions": "completion"}


def generate(
    model,
    ids: list[int],
    *,
    max_tokens: int,
    temperature: float = 1.0,
    top_p: float = 1.0,
    top_k: int = -1,
    seed: int | None = None,
    stop_tokens: set[int] = frozenset(),
    top_logprobs: int = 0,
) -> Iterator[tuple[int, float, list]]:
    """(token, its logprob, the top logprobs) one at a time after the prompt `ids`: greedy at
    temperature 0, else sampled with temperature, top_k and top_p from a generator seeded by
    `seed`, so a seeded call repeats. The logprob is the model's own (before temperature), as a
    forward pass scores the token. A token of `stop_tokens` is yielded, then generation stops.
    Shared by this server and the Tinker worker's sampling (worker/tinker_model.py)."""
    import torch

    generator = None if seed is None else torch.Generator().manual_seed(seed % 2**63)
    device = getattr(model, "device", "cpu")  # the Tinker worker's model is on its GPU, if any
    past, step = None, torch.tensor([ids], device=device)
    with torch.no_grad():
        for _ in range(max_tokens):
            out = model(input_ids=step, cache=past, use_cache=True)
            past = out.cache
            logits = out.logits[0, -1].float().cpu()  # sampled with the (CPU) seeded generator
            logprobs = torch.log_softmax(logits, -1)
            if temperature == 0:
                token = int(torch.argmax(logits))
            else:
                probs = torch.softmax(logits / temperature, -1)
                if 0 < top_k < probs.numel():
                    probs[probs < torch.topk(probs, top_k).values[-1]] = 0
                if top_p < 1:
                    ordered, order = torch.sort(probs, descending=True)
                    outside = torch.cumsum(ordered, 0) - ordered > top_p
                    probs[order[outside]] = 0
                token = int(torch.multinomial(probs / probs.sum(), 1, generator=generator))
            top = []
            if top_logprobs:
                values, indices = torch.topk(logprobs, top_logprobs)
                top = list(zip(indices.tolist(), values.tolist(), strict=True))
            yield token, float(logprobs[token]), top
            if token in stop_tokens:
                return
            step = torch.tensor([[token]], device=device)


class Engine:
    """The base model with every adapter loaded (PEFT), routed by the name a request gives."""

    def __init__(self, base_path: Path, adapters: dict[str, Path], base_name: str):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(base_path)
        model = AutoModelForCausalLM.from_pretrained(base_path)
        # PEFT names adapters as module keys: ours are a0, a1, …, mapped from the served names.
        self.adapter_of: dict[str, str | None] = {base_name: None}
        if adapters:
            from peft import PeftModel

            for index, (name, path) in enumerate(adapters.items()):
                key = f"a{index}"
                if index == 0:
                    model = PeftModel.from_pretrained(model, path, adapter_name=key)
                else:
                    model.load_adapter(path, adapter_name=key)
                self.adapter_of[name] = key
        self.model = model.eval()
        self.lock = threading.Lock()
        self.context = getattr(model.config, "max_position_embeddings", None) or 4096

    @property
    def models(self) -> set[str]:
        return set(self.adapter_of)

    def prompt_ids(self, request: Generation) -> list[int]:
        if request.kind == "chat":
            ids = self.tokenizer.apply_chat_template(
                request.messages, add_generation_prompt=True, tokenize=True, return_dict=True
            )["input_ids"]  # as training renders it (worker.formats)
        else:
            ids = self.tokenizer(request.prompt)["input_ids"]
        if not ids:
            raise BadRequest("The prompt is empty.", param="prompt")
        if len(ids) + request.max_tokens > self.context:
            raise BadRequest(
                f"This model's context is {self.context} tokens; the prompt has {len(ids)} and "
                f"max_tokens asks for {request.max_tokens} more.",
                param="max_tokens" if len(ids) < self.context else "messages",
                code="context_length_exceeded",
            )
        return ids

    def _adapter(self, model: str):
        key = self.adapter_of[model]
        if key is None:
            return (
                self.model.disable_adapter()
                if hasattr(self.model, "disable_adapter")
                else nullcontext()
            )
        self.model.set_adapter(key)
        return nullcontext()

    def tokens(
        self, request: Generation, ids: list[int], index: int
    ) -> Iterator[tuple[int, float, list]]:
        """(token, its logprob, the top logprobs) one at a time (see `generate`), the choice's
        index added to the seed so that each choice differs. Caller holds the lock."""
        seed = None if request.seed is None else request.seed + index
        eos = self.tokenizer.eos_token_id
        with self._adapter(request.model):
            yield from generate(
                self.model,
                ids,
                max_tokens=request.max_tokens,
                temperature=request.temperature,
                top_p=request.top_p,
                seed=seed,
                stop_tokens=set() if eos is None else {eos},
                top_logprobs=request.top_logprobs,
            )

    def text(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def piece(self, token: int) -> str:
        return self.tokenizer.decode([token])


class Choice:
    """One choice's text as it grows: stop sequences cut it, and text that could still become
    a stop sequence (or half a character) is held back until it cannot."""

    def __init__(self, engine: Engine, request: Generation):
        self.engine, self.request = engine, request
        self.ids: list[int] = []
        self.sent = ""
        self.finish: str | None = None
        self.logprobs: list[tuple[int, float, list]] = []

    def add(self, token: int, logprob: float, top: list) -> str:
        """The new text safe to send after `token`."""
        eos = token == self.engine.tokenizer.eos_token_id
        if not eos:
            self.ids.append(token)
            self.logprobs.append((token, logprob, top))
        text = self.engine.text(self.ids)
        cut = min((text.find(s) for s in self.request.stop if s in text), default=-1)
        if cut >= 0:
            text, self.finish = text[:cut], "stop"
        elif eos:
            self.finish = "stop"
        elif len(self.ids) >= self.request.max_tokens:
            self.finish = "length"
        if self.finish is None:
            hold = max(
                (k for s in self.request.stop for k in range(1, len(s)) if text.endswith(s[:k])),
                default=0,
            )
            if text.endswith("\ufffd"):
                hold = max(hold, 1)
            text = text[: len(text) - hold]
        delta = text[len(self.sent) :] if text.startswith(self.sent) else ""
        self.sent += delta
        return delta


def _logprobs(engine: Engine, request: Generation, entries: list) -> dict | None:
    if not request.logprobs:
        return None
    piece = engine.piece
    if request.kind == "chat":
        return {
            "content": [
                {
                    "token": piece(token),
                    "logprob": logprob,
                    "bytes": list(piece(token).encode()),
                    "top_logprobs": [
                        {"token": piece(t), "logprob": lp, "bytes": list(piece(t).encode())}
                        for t, lp in top
                    ],
                }
                for token, logprob, top in entries
            ]
        }
    offsets, at = [], 0
    for token, _, _ in entries:
        offsets.append(at)
        at += len(piece(token))
    return {
        "tokens": [piece(t) for t, _, _ in entries],
        "token_logprobs": [lp for _, lp, _ in entries],
        "top_logprobs": [{piece(t): lp for t, lp in top} for _, _, top in entries],
        "text_offset": offsets,
    }


class Answer:
    """A request's answer, whole or as server-sent chunks, in OpenAI's objects."""

    def __init__(self, engine: Engine, request: Generation):
        self.engine, self.request = engine, request
        prefix = "chatcmpl" if request.kind == "chat" else "cmpl"
        self.id = f"{prefix}-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.prompt = engine.prompt_ids(request)
        self.completion_tokens = 0

    def _object(self, chunk: bool) -> dict:
        if self.request.kind == "chat":
            kind = "chat.completion.chunk" if chunk else "chat.completion"
        else:
            kind = "text_completion"
        return {"id": self.id, "object": kind, "created": self.created, "model": self.request.model}

    def usage(self) -> dict:
        prompt = len(self.prompt)  # read once for all `n` choices, as OpenAI counts it
        return {
            "prompt_tokens": prompt,
            "completion_tokens": self.completion_tokens,
            "total_tokens": prompt + self.completion_tokens,
        }

    def _choice(self, index: int, text: str, finish, entries: list, first: bool) -> dict:
        logprobs = _logprobs(self.engine, self.request, entries)
        if self.request.kind == "completion":
            return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish}
        if not self.request.stream:
            message = {"role": "assistant", "content": text, "refusal": None}
            return {
                "index": index,
                "message": message,
                "logprobs": logprobs,
                "finish_reason": finish,
            }
        delta = ({"role": "assistant"} if first else {}) | (
            {"content": text} if text or first else {}
        )
        return {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}

    def choices(self) -> Iterator[tuple[int, Choice, str, list]]:
        """Each choice's deltas as generated: (index, choice, new text, new logprob entries)."""
        for index in range(self.request.n):
            choice = Choice(self.engine, self.request)
            for token, logprob, top in self.engine.tokens(self.request, self.prompt, index):
                before = len(choice.logprobs)
                delta = choice.add(token, logprob, top)
                self.completion_tokens += 1 if token != self.engine.tokenizer.eos_token_id else 0
                yield index, choice, delta, choice.logprobs[before:]
                if choice.finish:
                    break

    def whole(self) -> dict:
        choices = {}
        for index, choice, _, _ in self.choices():
            choices[index] = choice
        return self._object(False) | {
            "choices": [
                self._choice(i, c.sent, c.finish or "length", c.logprobs, False)
                for i, c in sorted(choices.items())
            ],
            "usage": self.usage(),
        }

    def chunks(self) -> Iterator[dict]:
        started: set[int] = set()
        for index, choice, delta, entries in self.choices():
            first = index not in started
            started.add(index)
            finish = choice.finish
            if delta or first or finish or entries:
                yield self._object(True) | {
                    "choices": [self._choice(index, delta, finish, entries, first)]
                }
        if self.request.include_usage:
            yield self._object(True) | {"choices": [], "usage": self.usage()}


def error_body(message: str, kind: str = "server_error", code: str | None = None) -> dict:
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


def handler_for(engine: Engine, key: str):
    """The replica's server: every route but `/health` requires `Authorization: Bearer KEY`,
    the replica's serving key, which only the router holds."""
    expected = f"Bearer {key}".encode()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"  # streams end when the connection closes

        def log_message(self, format, *args):  # noqa: A002 - the base class's name
            pass

        def _json(self, status: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _refused(self) -> bool:
            given = self.headers.get("Authorization", "").encode()
            if hmac.compare_digest(given, expected):
                return False
            self._json(401, error_body("A serving key is required.", "invalid_request_error"))
            return True

        def do_GET(self):  # noqa: N802 - the base class's name
            if self.path == "/health":
                return self._json(200, {"ok": True})
            if self._refused():
                return None
            if self.path == "/v1/models":
                data = [
                    {"id": m, "object": "model", "owned_by": "veri"} for m in sorted(engine.models)
                ]
                return self._json(200, {"object": "list", "data": data})
            return self._json(404, error_body("Not found.", "invalid_request_error"))

        def do_POST(self):  # noqa: N802 - the base class's name
            if self._refused():
                return None
            kind = ROUTES.get(self.path)
            if kind is None:
                return self._json(404, error_body("Not found.", "invalid_request_error"))
            try:
                length = int(self.headers.get("Content-Length") or 0)
                if length > MAX_BODY_BYTES:
                    raise BadRequest("The request body is too large.")
                try:
                    body = json.loads(self.rfile.read(length) or b"null")
                except ValueError:
                    raise BadRequest(
                        "The request body is not valid JSON.", code="invalid_json"
                    ) from None
                request = parse(kind, body, engine.models)
                with engine.lock:
                    answer = Answer(engine, request)
                    if not request.stream:
                        return self._json(200, answer.whole())
                    self.send_response(200)
                    self.send_header("Content-Type", "text/event-stream")
                    self.send_header("Cache-Control", "no-cache")
                    self.end_headers()
                    try:
                        for chunk in answer.chunks():
                            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                            self.wfile.flush()
                    except (BrokenPipeError, ConnectionResetError):
                        return  # the client went away: stop generating for it
                    except Exception as exc:  # noqa: BLE001 - said in the stream, then it ends
                        traceback.print_exc()
                        event = error_body(f"Generation failed: {type(exc).__name__}")
                        self.wfile.write(f"data: {json.dumps(event)}\n\n".encode())
                        return
                    self.wfile.write(b"data: [DONE]\n\n")
                    self.wfile.flush()
            except BadRequest as exc:
                self._json(exc.status, exc.body())
            except Exception as exc:  # noqa: BLE001 - a bug answers 500 in OpenAI's shape
                traceback.print_exc()
                self._json(500, error_body(f"The server failed: {type(exc).__name__}"))

    return Handler


def fetch_files(http: httpx.Client, files: list[dict], folder: Path) -> Path:
    for file in files:
        target = (folder / file["path"]).resolve()
        if not target.is_relative_to(folder.resolve()):
            raise ValueError(f"a file path leaves its folder: {file['path']!r}")
        download(http, file["url"], target, file.get("headers"))
    return folder


def fetch_models(spec: dict, work: Path) -> tuple[Path | str, dict[str, Path]]:
    """The spec's base model (its folder in `work`, or the hub id when it has no files) and each
    adapter's folder, fetched from the spec's presigned URLs."""
    http = httpx.Client(timeout=600)
    base = spec["base_model"]
    base_path = (
        fetch_files(http, base["files"], work / "base") if base.get("files") else base["name"]
    )
    adapters = {
        adapter["name"]: fetch_files(http, adapter["files"], work / "adapters" / str(index))
        for index, adapter in enumerate(spec["adapters"])
    }
    return base_path, adapters


def serve(
    *,
    replica_id: str,
    api_url: str,
    engine: str = "cpu",
    tensor_parallel_size: int = 1,
    max_loras: int = 1,
) -> int:
    token = os.environ.pop("VERI_REPLICA_TOKEN", None)
    key = os.environ.pop("VERI_SERVING_KEY", None)
    if not token or not key:
        print("VERI_REPLICA_TOKEN and VERI_SERVING_KEY must be set", file=sys.stderr)
        return 2
    api = ControlPlane(api_url=api_url, job_id=replica_id, token=token, kind="replicas")
    spec = api.call("POST", "/register")
    work = Path(os.environ.get("VERI_WORK_DIR") or f"/tmp/veri-replica-{replica_id}")
    period = float(spec.get("heartbeat_interval_seconds") or 15)
    try:
        base, adapters = fetch_models(spec, work)
        model = None if engine == "vllm" else Engine(base, adapters, spec["base_model"]["name"])
    except Exception as exc:  # noqa: BLE001 - whatever the model files did, it is reported
        traceback.print_exc()
        api.call(
            "POST",
            "/failed",
            json={"code": "model_load_error", "message": f"{type(exc).__name__}: {exc}"[:10_000]},
        )
        return 1
    if model is None:
        from worker import serve_vllm

        return serve_vllm.run(
            api,
            base=base,
            served_name=spec["base_model"]["name"],
            adapters=adapters,
            key=key,
            tensor_parallel_size=tensor_parallel_size,
            max_loras=max_loras,
            heartbeat_seconds=period,
            silent_seconds=float(spec.get("silent_seconds") or 120),
        )
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler_for(model, key))
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    host, port = server.server_address[:2]
    api.call("POST", "/ready", json={"url": f"http://{host}:{port}"})
    print(f"[veri] serving {sorted(model.models)} on http://{host}:{port}", flush=True)
    heard, silent = time.monotonic(), float(spec.get("silent_seconds") or 120)
    while heard is not None:
        time.sleep(period)
        heard = heartbeat(api, heard, silent)
    server.shutdown()
    return 0
