"""A real HTTP proxy in front of a test server that breaks chosen requests the way networks do:
an error status, a connection dropped after the server did the work, a body cut halfway."""

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx

from tests.conftest import serve_in_background


class FaultyProxy:
    def __init__(self, upstream: str):
        self.upstream = upstream.rstrip("/")
        self.faults: list[dict] = []  # {match, kind, times, status}
        self.seen: list[tuple[str, str]] = []  # (method, path) of every request
        self.lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self):
                proxy.handle(self)

            do_POST = do_PUT = do_DELETE = do_GET

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        serve_in_background(self.server)

    def add(
        self, match: str, kind: str, *, times: int = 1, status: int = 500, after: int = 0
    ) -> None:
        """Break `times` requests whose path contains `match`, once `after` of them went through:
        `status` (answer it), `drop` (forward it, then close without answering), `cut` (half
        the body, then close)."""
        self.faults.append(
            {"match": match, "kind": kind, "times": times, "status": status, "after": after}
        )

    def count(self, match: str, method: str | None = None) -> int:
        return sum(1 for m, p in self.seen if match in p and (method is None or m == method))

    def _fault_for(self, path: str) -> dict | None:
        with self.lock:
            for fault in self.faults:
                if fault["match"] not in path or fault["times"] <= 0:
                    continue
                if fault["after"] > 0:
                    fault["after"] -= 1
                    continue
                fault["times"] -= 1
                return fault
        return None

    def handle(self, request: BaseHTTPRequestHandler) -> None:
        length = int(request.headers.get("Content-Length") or 0)
        body = request.rfile.read(length) if length else b""
        with self.lock:
            self.seen.append((request.command, request.path))
        fault = self._fault_for(request.path)
        if fault and fault["kind"] == "status":
            payload = b'{"error": {"code": "injected", "message": "injected fault", "field": null}}'
            self._answer(request, fault["status"], {"Content-Type": "application/json"}, payload)
            return
        # The Host header goes through, so URLs the server builds point back at this proxy.
        headers = {k: v for k, v in request.headers.items() if k.lower() != "content-length"}
        answer = httpx.request(
            request.command,
            self.upstream + request.path,
            headers=headers,
            content=body,
            timeout=60,
        )
        if fault and fault["kind"] == "drop":
            request.close_connection = True
            request.connection.close()
            return
        content = answer.content
        if fault and fault["kind"] == "cut":
            request.send_response(answer.status_code)
            request.send_header("Content-Length", str(len(content)))
            request.end_headers()
            request.wfile.write(content[: len(content) // 2])
            request.wfile.flush()
            request.close_connection = True
            request.connection.close()
            return
        keep = {"content-type", "etag", "retry-after", "content-range"}
        self._answer(
            request,
            answer.status_code,
            {k: v for k, v in answer.headers.items() if k.lower() in keep},
            content,
        )

    @staticmethod
    def _answer(request, status: int, headers: dict, content: bytes) -> None:
        request.send_response(status)
        for name, value in headers.items():
            request.send_header(name, value)
        request.send_header("Content-Length", str(len(content)))
        request.end_headers()
        request.wfile.write(content)

    def close(self) -> None:
        self.server.shutdown()
