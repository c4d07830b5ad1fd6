"""A real HTTP proxy in front of moto's EC2 that refuses chosen launches the way EC2 does (an
error document with EC2's code), reports the lifecycle states moto skips, and records every
action asked of it."""

import json
import re
import threading
import xml.etree.ElementTree as ET
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlencode
from xml.sax.saxutils import escape

import httpx

from tests.conftest import serve_in_background

ERROR = (
    '<?xml version="1.0" encoding="UTF-8"?>\n<Response><Errors><Error><Code>{code}</Code>'
    "<Message>{message}</Message></Error></Errors><RequestID>injected</RequestID></Response>"
)
EC2_NS = "http://ec2.amazonaws.com/doc/2016-11-15"
# An instance's state name and code, as DescribeInstances reports them
# (https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_InstanceState.html, `Code`).
STATE_CODES = {
    "pending": 0,
    "running": 16,
    "shutting-down": 32,
    "terminated": 48,
    "stopping": 64,
    "stopped": 80,
}


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
        # instance id -> the state DescribeInstances reports for it. moto moves an instance
        # between running, stopped and terminated at once; EC2's transitional states (pending,
        # stopping, shutting-down) are reported here, over moto's, and an `instance-state-name`
        # filter is applied to them as EC2 applies it (API_DescribeInstances.html, "Filters").
        # A TerminateInstances ends the override: EC2 then moves the instance towards
        # terminated, which moto reports.
        self.states: dict[str, str] = {}
        # instance id -> the public IP DescribeInstances reports for it (moto makes up its own,
        # which nothing here listens on): a loopback alias stands in for a machine's address.
        self.addresses: dict[str, str] = {}
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
        serve_in_background(self.server)

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
        wanted_states = None
        if fields.get("Action") == "DescribeInstances" and self.states:
            body, wanted_states = self._without_state_filter(fields)
        if fields.get("Action") == "TerminateInstances":
            for key, value in fields.items():
                if key.startswith("InstanceId."):
                    self.states.pop(value, None)
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
        overridden = self.states or self.addresses
        if fields.get("Action") == "DescribeInstances" and overridden and answer.is_success:
            result = (answer.status_code, self._reported(answer.content, wanted_states), result[2])
        if token and answer.status_code == 200:
            self.by_client_token[token] = result
        if fields.get("Action") == "RunInstances" and self.lose_next_launch:
            self.lose_next_launch = False  # launched, but the answer is lost
            payload = ERROR.format(code="ServiceUnavailable", message="answer lost").encode()
            self._answer(request, 503, payload, "text/xml")
            return
        self._answer(request, *result)

    @staticmethod
    def _without_state_filter(fields: dict) -> tuple[bytes, set[str] | None]:
        """The DescribeInstances request without its `instance-state-name` filter (applied
        here instead, to the states reported), and that filter's values (None: no filter)."""
        filters: dict[str, dict[str, str]] = {}
        rest = {}
        for key, value in fields.items():
            if match := re.fullmatch(r"Filter\.(\d+)\.(.+)", key):
                filters.setdefault(match[1], {})[match[2]] = value
            else:
                rest[key] = value
        wanted = None
        kept = []
        for _, parts in sorted(filters.items(), key=lambda item: int(item[0])):
            values = {v for k, v in parts.items() if k.startswith("Value.")}
            if parts.get("Name") == "instance-state-name":
                wanted = values
            else:
                kept.append(parts)
        for n, parts in enumerate(kept, start=1):  # moto reads Filter.1, Filter.2, ... in turn
            rest |= {f"Filter.{n}.{k}": v for k, v in parts.items()}
        return urlencode(rest).encode(), wanted

    def _reported(self, document: bytes, wanted: set[str] | None) -> bytes:
        """moto's DescribeInstances answer with the overridden states, and without the instances
        whose state the request's `instance-state-name` filter leaves out."""
        ET.register_namespace("", EC2_NS)
        ns = {"ec2": EC2_NS}
        root = ET.fromstring(document)
        reservations = root.find("ec2:reservationSet", ns)
        for reservation in list(reservations):
            instances = reservation.find("ec2:instancesSet", ns)
            for instance in list(instances):
                state = instance.find("ec2:instanceState", ns)
                name = self.states.get(instance.findtext("ec2:instanceId", "", ns))
                if name is not None:
                    state.find("ec2:name", ns).text = name
                    state.find("ec2:code", ns).text = str(STATE_CODES[name])
                address = self.addresses.get(instance.findtext("ec2:instanceId", "", ns))
                if address is not None:
                    found = instance.find("ec2:ipAddress", ns)
                    if found is None:
                        found = ET.SubElement(instance, f"{{{EC2_NS}}}ipAddress")
                    found.text = address
                if wanted is not None and state.findtext("ec2:name", "", ns) not in wanted:
                    instances.remove(instance)
            if not len(instances):
                reservations.remove(reservation)
        return ET.tostring(root, encoding="utf-8", xml_declaration=True)

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
