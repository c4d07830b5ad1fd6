"""Stripe, faked at the HTTP level: the official `stripe` package talks to it as to Stripe, and it
sends the events Stripe sends, signed with the `stripe` package's own signature scheme.

Each behaviour cites what it follows: Stripe's documentation, or the `stripe` package's generated
types (`stripe/_charge.py`, `stripe/_refund.py`, `stripe/_dispute.py`,
`stripe/checkout/_session.py`), which are generated from Stripe's OpenAPI spec."""

import copy
import itertools
import json
import time
from http.server import BaseHTTPRequestHandler
from urllib.parse import parse_qs, urlsplit

import stripe

SECRET = "whsec_test_secret"
_numbers = itertools.count(1)


def new_id(prefix: str) -> str:
    return f"{prefix}_{next(_numbers)}"


def sign(payload: bytes, secret: str = SECRET, at: int | None = None) -> str:
    """The `Stripe-Signature` header Stripe sends, made by the `stripe` package itself."""
    return stripe.WebhookSignature.generate_signature_header(payload.decode(), secret, timestamp=at)


def _fields(body: dict, prefix: str) -> dict:
    """`prefix[key]=value` form fields (how the `stripe` package encodes a hash) as a dict."""
    return {
        key[len(prefix) + 1 : -1]: values[0]
        for key, values in body.items()
        if key.startswith(prefix + "[") and key.count("[") == prefix.count("[") + 1
    }


def _missing(kind: str, object_id: str, param: str, status: int = 400) -> tuple[int, dict]:
    # Stripe's answer for an id it does not know, e.g. {"code": "resource_missing", "message":
    # "No such price: 'price_…'", "param": …, "type": "invalid_request_error"}; an object of the
    # other mode (a test-mode customer asked for with a live key) is not found the same way.
    return status, {
        "error": {
            "code": "resource_missing",
            "doc_url": "https://stripe.com/docs/error-codes/resource-missing",
            "message": f"No such {kind}: '{object_id}'",
            "param": param,
            "type": "invalid_request_error",
        }
    }


class FakeStripe(BaseHTTPRequestHandler):
    """The Stripe endpoints Veri uses, over the objects Stripe would hold. Like Stripe, a repeated
    Idempotency-Key gets the first answer back (including a 500)."""

    requests: list[dict] = []
    answers: dict[str, tuple[int, dict]] = {}
    # Customer ids whose requests Stripe cannot serve now (503, nothing remembered for the key).
    unavailable_for: set[str] = set()
    # The objects this Stripe account holds, by id (each knows its mode: `livemode`).
    objects: dict[str, dict] = {}
    # Answers to give instead of serving, for requests whose path ends with the key, in turn:
    # (status, body, and whether the request took effect all the same).
    failures: dict[str, list[tuple[int, dict, bool]]] = {}

    @classmethod
    def reset(cls) -> None:
        cls.requests, cls.answers, cls.unavailable_for = [], {}, set()
        cls.objects, cls.failures = {}, {}

    # HTTP

    def do_GET(self):
        url = urlsplit(self.path)
        query = {key: values[0] for key, values in parse_qs(url.query).items()}
        status, answer = self.listing(url.path, query)
        FakeStripe.requests.append(
            {"method": "GET", "path": url.path, "body": query, "key": None, "status": status}
        )
        self.reply(status, answer)

    def do_POST(self):
        body = parse_qs(self.rfile.read(int(self.headers["Content-Length"] or 0)).decode())
        key = self.headers.get("Idempotency-Key")
        failure = next(
            (
                queue
                for suffix, queue in FakeStripe.failures.items()
                if self.path.endswith(suffix) and queue
            ),
            None,
        )
        if any(f"/customers/{c}/" in self.path for c in FakeStripe.unavailable_for):
            status, answer = 503, {"error": {"message": "unavailable", "type": "api_error"}}
        elif key and key in FakeStripe.answers:
            status, answer = FakeStripe.answers[key]
        elif failure:
            status, answer, takes_effect = failure.pop(0)
            if takes_effect:  # Stripe failed after doing the work: a 500 can be that
                self.answer(body)
            if key and status == 500:
                # "Stripe saves the status code and body of the first request made with a given
                # idempotency key after endpoint execution begins. Retries with the same key
                # return the saved response, including 500 errors."
                # (https://docs.stripe.com/api/idempotent_requests)
                FakeStripe.answers[key] = (status, answer)
        else:
            status, answer = self.answer(body)
            if key and status < 500:
                FakeStripe.answers[key] = (status, answer)
        FakeStripe.requests.append(
            {"method": "POST", "path": self.path, "body": body, "key": key, "status": status}
        )
        self.reply(status, answer)

    def reply(self, status: int, answer: dict) -> None:
        payload = json.dumps(answer).encode()
        self.send_response(status)
        if status >= 500:
            # The `stripe` package retries a 5xx unless Stripe says not to; for a 500, "we
            # expect the stripe-should-retry header to be false in most cases ... since our
            # idempotency framework would typically replay it anyway" (stripe/_http_client.py).
            # The tests' outages outlast a retry, too.
            self.send_header("Stripe-Should-Retry", "false")
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args):
        pass

    @property
    def livemode(self) -> bool:
        """The mode of the key the request carries: objects of the other mode do not exist for
        it ("If the object exists in live mode, the value is `true`", `livemode` on every
        object in the generated types)."""
        key = self.headers.get("Authorization", "").removeprefix("Bearer ")
        return key.startswith(("sk_live_", "rk_live_"))

    def customer(self, customer_id: str) -> dict | None:
        found = FakeStripe.objects.get(customer_id)
        if found and found["object"] == "customer" and found["livemode"] == self.livemode:
            return found
        return None

    def answer(self, body: dict) -> tuple[int, dict]:
        if self.path == "/v1/customers":
            customer = {
                "id": new_id("cus"),
                "object": "customer",
                "livemode": self.livemode,
                "balance": int(body.get("balance", ["0"])[0]),
                "metadata": _fields(body, "metadata"),
            }
            FakeStripe.objects[customer["id"]] = customer
            return 200, customer
        if self.path == "/v1/checkout/sessions":
            customer_id = body["customer"][0]
            if self.customer(customer_id) is None:
                return _missing("customer", customer_id, "customer")
            return 200, self.new_session(body, customer_id)
        if self.path.endswith("/balance_transactions"):
            customer_id = self.path.split("/")[3]
            customer = self.customer(customer_id)
            if customer is None:
                return _missing("customer", customer_id, "id", status=404)
            amount = int(body["amount"][0])
            txn = {
                "id": new_id("cbtxn"),
                "object": "customer_balance_transaction",
                "amount": amount,
                "currency": body["currency"][0],
                "customer": customer_id,
                "livemode": self.livemode,
                "metadata": _fields(body, "metadata"),
            }
            customer["balance"] += amount
            FakeStripe.objects[txn["id"]] = txn
            return 200, txn
        return 404, {"error": {"message": f"no route {self.path}", "type": "invalid_request_error"}}

    def new_session(self, body: dict, customer_id: str) -> dict:
        unit = int(body["line_items[0][price_data][unit_amount]"][0])
        quantity = int(body["line_items[0][quantity]"][0])
        session_id = new_id("cs_test" if not self.livemode else "cs_live")
        session = {
            "id": session_id,
            "object": "checkout.session",
            "amount_subtotal": unit * quantity,
            "amount_total": unit * quantity,
            "client_reference_id": body.get("client_reference_id", [None])[0],
            "currency": body["line_items[0][price_data][currency]"][0],
            "customer": customer_id,
            "livemode": self.livemode,
            "metadata": _fields(body, "metadata"),
            "mode": "payment",
            # The PaymentIntent is made when the customer pays: "The ID of the PaymentIntent
            # for Checkout Sessions in `payment` mode" (null until then).
            "payment_intent": None,
            "payment_status": "unpaid",
            "presentment_details": None,
            "status": "open",
            "success_url": body["success_url"][0],
            "cancel_url": body["cancel_url"][0],
            "url": f"https://checkout.stripe.test/pay/{session_id}",
            "_payment_intent_metadata": _fields(body, "payment_intent_data[metadata]"),
        }
        FakeStripe.objects[session_id] = session
        return _public(session)

    def listing(self, path: str, query: dict) -> tuple[int, dict]:
        if path.endswith("/balance_transactions"):
            customer_id = path.split("/")[3]
            if self.customer(customer_id) is None:
                return _missing("customer", customer_id, "id", status=404)
            data = [
                o
                for o in FakeStripe.objects.values()
                if o["object"] == "customer_balance_transaction" and o["customer"] == customer_id
            ]
        elif path == "/v1/refunds":
            data = [
                o
                for o in FakeStripe.objects.values()
                if o["object"] == "refund" and o["charge"] == query.get("charge")
            ]
        else:
            return 404, {"error": {"message": f"no route {path}", "type": "invalid_request_error"}}
        # Lists are newest first, in pages with `has_more` (https://docs.stripe.com/api/pagination).
        return 200, {
            "object": "list",
            "data": [_public(o) for o in reversed(data)],
            "has_more": False,
            "url": path,
        }


def _public(obj: dict) -> dict:
    return {k: copy.deepcopy(v) for k, v in obj.items() if not k.startswith("_")}


# What Stripe sends


def event(event_type: str, obj: dict, *, livemode: bool | None = None) -> bytes:
    """An Event object (https://docs.stripe.com/api/events/object) as a webhook body: a snapshot
    of the object as it is now, under a new event id."""
    body = {
        "id": new_id("evt"),
        "object": "event",
        "api_version": stripe.api_version,
        "created": int(time.time()),
        "data": {"object": _public(obj)},
        "livemode": obj.get("livemode", False) if livemode is None else livemode,
        "pending_webhooks": 1,
        "request": {"id": None, "idempotency_key": None},
        "type": event_type,
    }
    return json.dumps(body).encode()


def twin(payload: bytes) -> bytes:
    """A second Event object for the same change of the same object. Stripe's webhook docs:
    "Webhook endpoints might occasionally receive the same event more than once. ... In some
    cases, two separate Event objects are generated and sent." (https://docs.stripe.com/webhooks,
    "Handle duplicate events")."""
    body = json.loads(payload)
    body["id"] = new_id("evt")
    return json.dumps(body).encode()


def pay(
    session_id: str,
    *,
    method: str = "card",
    outcome: str = "succeeded",
    presentment: tuple[str, int] | None = None,
) -> list[bytes]:
    """The customer pays the Checkout Session; the events Stripe sends, in the order it sends
    them. Stripe's fulfillment guide (https://docs.stripe.com/checkout/fulfillment, "Immediate
    versus delayed payment methods"): with a card the session completes `paid`; with a delayed
    method (ACH Direct Debit, SEPA, bank transfers) `checkout.session.completed` arrives with
    `payment_status: "unpaid"`, then `checkout.session.async_payment_succeeded` (now `paid`) or
    `checkout.session.async_payment_failed`. `presentment`: the customer paid in their own
    currency (Adaptive Pricing): the session keeps its own `amount_total` and `currency`, and
    `presentment_details` says what the customer saw ("Amount intended to be collected by this
    payment, denominated in `presentment_currency`")."""
    session = FakeStripe.objects[session_id]
    intent = {
        "id": new_id("pi"),
        "object": "payment_intent",
        "amount": session["amount_total"],
        "currency": session["currency"],
        "livemode": session["livemode"],
        "metadata": dict(session["_payment_intent_metadata"]),
    }
    charge = {
        "id": new_id("ch"),
        "object": "charge",
        "amount": session["amount_total"],
        "amount_refunded": 0,
        "currency": session["currency"],
        "disputed": False,
        "livemode": session["livemode"],
        "metadata": dict(intent["metadata"]),
        "paid": True,
        "payment_intent": intent["id"],
        "refunded": False,
        "status": "succeeded" if method == "card" else "pending",
    }
    FakeStripe.objects[intent["id"]], FakeStripe.objects[charge["id"]] = intent, charge
    session.update(payment_intent=intent["id"], status="complete", _charge=charge["id"])
    session["payment_method_types"] = [method]
    if presentment:
        currency, amount = presentment
        session["presentment_details"] = {
            "presentment_amount": amount,
            "presentment_currency": currency,
        }
    if method == "card":
        session["payment_status"] = "paid"
        return [event("checkout.session.completed", session)]
    events = [event("checkout.session.completed", session)]  # unpaid, for now
    if outcome == "succeeded":
        session["payment_status"], charge["status"] = "paid", "succeeded"
        events.append(event("checkout.session.async_payment_succeeded", session))
    else:
        charge["status"] = "failed"
        events.append(event("checkout.session.async_payment_failed", session))
    return events


def foreign_checkout(*, currency: str, amount: int, metadata: dict, livemode=False) -> list[bytes]:
    """A Checkout Session Veri did not make, paid: a Payment Link or another integration on the
    same Stripe account ("Payment Links use Checkout", https://docs.stripe.com/checkout/fulfillment)
    reaches every endpoint that listens for `checkout.session.completed`, in its own `currency`."""
    session = {
        "id": new_id("cs_test"),
        "object": "checkout.session",
        "amount_total": amount,
        "currency": currency,
        "livemode": livemode,
        "metadata": metadata,
        "mode": "payment",
        "payment_intent": new_id("pi"),
        "payment_status": "paid",
        "status": "complete",
    }
    FakeStripe.objects[session["id"]] = session
    return [event("checkout.session.completed", session)]


def charge_of(session_id: str) -> dict:
    return FakeStripe.objects[FakeStripe.objects[session_id]["_charge"]]


def refund(session_id: str, cents: int | None = None, *, status: str = "succeeded") -> list[bytes]:
    """A refund of the session's payment (from the Dashboard or the API), and the events Stripe
    sends: `charge.refunded` ("Occurs whenever a charge is refunded, including partial
    refunds"), whose charge carries the running `amount_refunded` ("can be less than the amount
    attribute on the charge if a partial refund was issued") but not the refunds themselves
    (left out of the charge since API version 2022-11-15), and, since 2024-10-28, `refund.created`
    for every refund ("The following events now apply to all types of refunds ... refund.created,
    refund.updated, refund.failed", https://docs.stripe.com/changelog/acacia/2024-10-28/refund-webhook-update)."""
    charge = charge_of(session_id)
    cents = charge["amount"] - charge["amount_refunded"] if cents is None else cents
    made = {
        "id": new_id("re"),
        "object": "refund",
        "amount": cents,
        "charge": charge["id"],
        "currency": charge["currency"],
        "livemode": charge["livemode"],
        "metadata": {},
        "payment_intent": charge["payment_intent"],
        "reason": "requested_by_customer",
        "status": status,
    }
    FakeStripe.objects[made["id"]] = made
    charge["amount_refunded"] += cents
    charge["refunded"] = charge["amount_refunded"] == charge["amount"]
    return [event("charge.refunded", charge), event("refund.created", made)]


def fail_refund(refund_id: str) -> list[bytes]:
    """A refund that fails after it was made (the card was closed): its `status` becomes
    `failed` ("This can be `pending`, `requires_action`, `succeeded`, `failed`, or `canceled`",
    with a `failure_reason` such as `expired_or_canceled_card`), and Stripe sends
    `refund.updated` and `refund.failed`."""
    made = FakeStripe.objects[refund_id]
    made.update(status="failed", failure_reason="expired_or_canceled_card")
    charge = FakeStripe.objects[made["charge"]]
    charge["amount_refunded"] -= made["amount"]
    charge["refunded"] = False
    return [event("refund.updated", made), event("refund.failed", made)]


def dispute(session_id: str, *, reason: str = "fraudulent", status: str = "needs_response"):
    """The cardholder disputes the payment: `charge.dispute.created` with a Dispute ("Disputed
    amount. Usually the amount of the charge"), its `charge`, `payment_intent` and `status`."""
    charge = charge_of(session_id)
    made = {
        "id": new_id("dp"),
        "object": "dispute",
        "amount": charge["amount"] - charge["amount_refunded"],
        "charge": charge["id"],
        "currency": charge["currency"],
        "is_charge_refundable": False,
        "livemode": charge["livemode"],
        "metadata": {},
        "payment_intent": charge["payment_intent"],
        "reason": reason,
        "status": status,
    }
    FakeStripe.objects[made["id"]] = made
    charge["disputed"] = True
    return made["id"], [event("charge.dispute.created", made)]


def close_dispute(dispute_id: str, status: str) -> list[bytes]:
    """The dispute is decided (`won`, `lost`; an inquiry ends `warning_closed`): Stripe sends
    `charge.dispute.closed`, and when won `charge.dispute.funds_reinstated` too (Dispute
    `status`: "warning_needs_response, warning_under_review, warning_closed, needs_response,
    under_review, ..., won, lost, or prevented")."""
    made = FakeStripe.objects[dispute_id]
    made["status"] = status
    events = [event("charge.dispute.closed", made)]
    if status == "won":
        events.append(event("charge.dispute.funds_reinstated", made))
    return events
