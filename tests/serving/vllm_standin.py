"""A stand-in for `vllm serve` (GPU-only) in the launcher's tests: it writes down how it was started
(VLLM_STANDIN_RECORD), then serves `/health` and `/v1/chat/completions` (streamed, naming the
model it was asked for) on the --host and --port it was given, after a second of "loading"; as
vLLM with `--api-key`, every `/v1` request must bear it (`Authorization: Bearer`), else 401.

VLLM_STANDIN_REFUSE=TEXT: print a traceback ending in TEXT and exit 1 while loading, as vLLM does
with a model it cannot load. A chat request for the model `crash` prints a CUDA error and exits 1,
as vLLM crashing while it serves."""

import json
import os
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

argv = sys.argv[1:]
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


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"

    def log_message(self, format, *args):  # noqa: A002 - the base class's name
        pass

    def do_GET(self):  # noqa: N802 - the base class's name
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()

    def do_POST(self):  # noqa: N802 - the base class's name
        if self.headers.get("Authorization") != f"Bearer {key}":
            self.send_response(401)
            self.end_headers()
            return
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
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


ThreadingHTTPServer((host, port), Handler).serve_forever()
