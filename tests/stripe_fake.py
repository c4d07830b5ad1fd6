"""Stripe, faked at the HTTP level: the official `stripe` package talks to it as to Stripe."""

import json
from http.server import BaseHTTPRequestHandler
from urllib.parse import parse_qs

SECRET = "whsec_test_secret"


class FakeStripe(BaseHTTPRequestHandler):
    """The few Stripe endpoints the gateway uses. Like Stripe, a repeated Idempotency-Key gets
    the first answer back."""

    requests: list[dict] = []
    answers: dict[str, tuple[int, dict]] = {}
    # Customer ids whose requests Stripe cannot serve now (503, nothing remembered for the key).
    unavailable_for: set[str] = set()

    def do_POST(self):
        body = parse_qs(self.rfile.read(int(self.headers["Content-Length"] or 0)).decode())
        key = self.headers.get("Idempotency-Key")
        if any(f"/customers/{c}/" in self.path for c in FakeStripe.unavailable_for):
            status, answer = 503, {"error": {"message": "unavailable", "type": "api_error"}}
        elif key and key in FakeStripe.answers:
            status, answer = FakeStripe.answers[key]
        else:
            status, answer = self.answer(body)
            if key:
                FakeStripe.answers[key] = (status, answer)
        FakeStripe.requests.append({"path": self.path, "body": body, "key": key, "status": status})
        payload = json.dumps(answer).encode()
        self.send_response(status)
        if status == 503:
            self.send_header("Stripe-Should-Retry", "false")  # the tests' outages outlast a retry
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def answer(self, body: dict) -> tuple[int, dict]:
        number = len(FakeStripe.requests)
        if self.path == "/v1/customers":
            return 200, {"id": f"cus_{number}", "object": "customer"}
        if self.path == "/v1/checkout/sessions":
            url = f"https://checkout.stripe.test/pay/cs_{number}"
            return 200, {"id": f"cs_{number}", "object": "checkout.session", "url": url}
        if self.path.endswith("/balance_transactions"):
            amount = int(body["amount"][0])
            return 200, {
                "id": f"cbtxn_{number}",
                "object": "customer_balance_transaction",
                "amount": amount,
            }
        return 404, {"error": {"message": f"no route {self.path}", "type": "invalid_request_error"}}

    def log_message(self, *args):
        pass
