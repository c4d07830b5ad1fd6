"""A real HTTP proxy in front of moto's EC2 that refuses chosen launches the way EC2 does (an
error document with EC2's code) and records every action asked of it."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs
from xml.sax.saxutils import escape

import httpx

ERROR = (
    '<?xml version="1.0" encoding="UTF-8"?>\n<Response><Errors><Error><Code>{code}</Code>'
    "<Message>{message}</Message></Error></Errors><RequestID>injected</RequestID></Response>"
)


class Ec2Proxy:
    def __init__(self, upstream: str):
        self.upstream = upstream.rstrip("/")
        # zone -> EC2's answer to RunInstances there: an error code (HTTP 400, a made-up
        # message), or (code, message, HTTP status) as EC2 words it
        self.refusals: dict[str, str | tuple[str, str, int]] = {}
        self.quotas: dict[str, float] = {}  # Service Quotas' code -> value (moto has none)
        self.actions: list[dict] = []  # every EC2 request's form fields (first values)
        self.lose_next_launch = False  # launch the next RunInstances, then answer 503
        # EC2's idempotency (https://docs.aws.amazon.com/ec2/latest/devguide/
        # ec2-api-idempotency.html): a RunInstances repeating a ClientToken is answered with the
        # first one's result, launching nothing. moto records the token but launches again.
        self.by_client_token: dict[str, tuple[int, bytes, str | None]] = {}
        self.lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                proxy.handle(self)

            do_GET = do_POST

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def calls(self, action: str) -> list[dict]:
        with self.lock:
            return [a for a in self.actions if a.get("Action") == action]

    def handle(self, request: BaseHTTPRequestHandler) -> None:
        body = request.rfile.read(int(request.headers.get("Content-Length") or 0))
        target = request.headers.get("X-Amz-Target", "")
        if target.endswith(".GetServiceQuota"):
            code = json.loads(body)["QuotaCode"]
            if code in self.quotas:
                quota = {"ServiceCode": "ec2", "QuotaCode": code, "Value": self.quotas[code]}
                payload = json.dumps({"Quota": quota}).encode()
                self._answer(request, 200, payload, "application/x-amz-json-1.1")
                return
        fields = {k: v[0] for k, v in parse_qs(body.decode("utf-8", "replace")).items()}
        with self.lock:
            self.actions.append(fields)
        zone = fields.get("Placement.AvailabilityZone", "")
        if fields.get("Action") == "RunInstances" and zone in self.refusals:
            refusal = self.refusals[zone]
            code, message, status = (
                refusal if isinstance(refusal, tuple) else (refusal, f"injected {refusal}", 400)
            )
            payload = ERROR.format(code=code, message=escape(message)).encode()
            self._answer(request, status, payload, "text/xml")
            return
        token = fields.get("ClientToken") if fields.get("Action") == "RunInstances" else None
        if token and token in self.by_client_token:
            self._answer(request, *self.by_client_token[token])
            return
        headers = {k: v for k, v in request.headers.items() if k.lower() != "content-length"}
        answer = httpx.request(
            request.command, self.upstream + request.path, headers=headers, content=body, timeout=60
        )
        result = (answer.status_code, answer.content, answer.headers.get("content-type"))
        if token and answer.status_code == 200:
            self.by_client_token[token] = result
        if fields.get("Action") == "RunInstances" and self.lose_next_launch:
            self.lose_next_launch = False  # launched, but the answer is lost
            payload = ERROR.format(code="ServiceUnavailable", message="answer lost").encode()
            self._answer(request, 503, payload, "text/xml")
            return
        self._answer(request, *result)

    @staticmethod
    def _answer(request, status: int, payload: bytes, content_type: str | None) -> None:
        request.send_response(status)
        request.send_header("Content-Type", content_type or "text/xml")
        request.send_header("Content-Length", str(len(payload)))
        request.end_headers()
        request.wfile.write(payload)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
