"""The only code that talks to Stripe, through the official `stripe` package. Stripe is the payment
edge, never the source of truth: top-ups arrive by signed webhook and become ledger entries; the
ledger is mirrored to the Stripe customer balance. Off while `STRIPE_SECRET_KEY` is unset.

Every Stripe failure leaves here as one of three answers: `StripeUnavailable` (Stripe could not
be reached or cannot serve now: 503, try again), `StripeRefused` (Stripe answered no: 502, an
operator acts on the message), or, for the balance mirror, `MirrorFailed`."""

import json
import re
import secrets
from dataclasses import dataclass

import stripe
from django.conf import settings
from django.db import transaction
from django.db.models import Sum

from billing.models import BillingAccount, LedgerEntry, StripeDeployment, StripeMirror
from veri.errors import VeriError

CURRENCY = "usd"  # the ledger's currency: every amount in it is micro-dollars


class PaymentsDisabled(Exception):
    """This deployment has no Stripe key: balances are the local ledger only."""


class BadSignature(Exception):
    """The webhook's body was not signed with our endpoint secret."""


class StripeUnavailable(VeriError):
    """Stripe could not be reached, or answered that it cannot serve now (5xx, 429): nothing was
    done, and the same request can be sent again after `Retry-After` seconds."""

    status, code = 503, "payments_unavailable"
    retry_after_seconds = 10


class StripeRefused(VeriError):
    """Stripe answered, and refused: retrying will not help; the message says what to fix."""

    status, code = 502, "payments_refused"


class MirrorFailed(Exception):
    """Stripe did not take a balance transaction (down, refused); it is tried again later.
    `stored`: Stripe answered 500, which it keeps as the answer for that idempotency key."""

    def __init__(self, message: str, *, stored: bool = False):
        super().__init__(message)
        self.stored = stored


class Unreadable(Exception):
    """A signed event whose object is not the shape Veri needs (the reason says what is off)."""


def payments_enabled() -> bool:
    return bool(settings.STRIPE_SECRET_KEY)


def key_mode() -> str:
    """The mode of `STRIPE_SECRET_KEY` (`sk_live_…`, `rk_live_…`: live; any other: test)."""
    return "live" if settings.STRIPE_SECRET_KEY.startswith(("sk_live_", "rk_live_")) else "test"


def deployment_id() -> str:
    """This deployment's name in what it sends to Stripe: `STRIPE_DEPLOYMENT_ID`, else an id made
    once and kept in the database (so two databases sharing one Stripe account differ)."""
    if settings.STRIPE_DEPLOYMENT_ID:
        return settings.STRIPE_DEPLOYMENT_ID
    row, _ = StripeDeployment.objects.get_or_create(
        pk=1, defaults={"deployment_id": secrets.token_hex(6)}
    )
    return row.deployment_id


def _client() -> stripe.StripeClient:
    if not payments_enabled():
        raise PaymentsDisabled("payments are disabled (STRIPE_SECRET_KEY is unset)")
    base = {"api": settings.STRIPE_API_BASE} if settings.STRIPE_API_BASE else None
    return stripe.StripeClient(
        settings.STRIPE_SECRET_KEY,
        base_addresses=base,
        max_network_retries=2,
        http_client=stripe.new_default_http_client(timeout=settings.STRIPE_TIMEOUT_SECONDS),
    )


def _message(exc: stripe.StripeError) -> str:
    text = exc.user_message or str(exc) or type(exc).__name__
    request_id = getattr(exc, "request_id", None)
    return f"{text} (Stripe request {request_id})" if request_id else text


def _answer(exc: stripe.StripeError, doing: str) -> VeriError:
    """A Stripe failure as the answer a request gives: 503 when Stripe is away or busy, else
    502 with Stripe's own words and what an operator does about them."""
    status = exc.http_status or 0
    if isinstance(exc, stripe.APIConnectionError | stripe.RateLimitError) or status >= 500:
        return StripeUnavailable(
            f"Stripe could not be reached to {doing}; nothing was charged. Try again shortly."
        )
    if isinstance(exc, stripe.AuthenticationError | stripe.PermissionError):
        return StripeRefused(
            f"Stripe refused this deployment's API key while trying to {doing}: {_message(exc)}. "
            "An operator must check STRIPE_SECRET_KEY."
        )
    return StripeRefused(
        f"Stripe refused to {doing}: {_message(exc)}. An operator can look the request up in "
        "the Stripe Dashboard (Developers, Logs)."
    )


def _is_missing_customer(exc: stripe.StripeError, customer_id: str) -> bool:
    """Stripe does not know the customer: made with a key of the other mode, in another account,
    or deleted there. (Its message names the id: "No such customer: 'cus_…'".)"""
    return (
        isinstance(exc, stripe.InvalidRequestError)
        and exc.code == "resource_missing"
        and customer_id in (exc.user_message or "")
    )


# Customers


def ensure_customer(account: BillingAccount) -> str:
    """The workspace's Stripe customer in the mode of the current key, made when it has none
    there (a customer made with a test key does not exist for a live one, and the other way)."""
    mode = key_mode()
    if account.stripe_customer_id and account.stripe_customer_mode in (mode, ""):
        return account.stripe_customer_id
    return _new_customer(account, replacing=account.stripe_customer_id)


def _new_customer(account: BillingAccount, *, replacing: str) -> str:
    """A new Stripe customer for the workspace, in place of `replacing` (the customer Stripe does
    not know, or ""). Under the account's row lock, so that two requests make one. It starts with
    the balance mirrored so far, so the mirror goes on from there instead of starting over."""
    mode = key_mode()
    with transaction.atomic():
        locked = (
            BillingAccount.objects.select_for_update(of=("self",))
            .select_related("workspace")
            .get(pk=account.pk)
        )
        if locked.stripe_customer_id != replacing and locked.stripe_customer_mode == mode:
            account.stripe_customer_id = locked.stripe_customer_id  # made meanwhile
            account.stripe_customer_mode = mode
            return locked.stripe_customer_id
        workspace = locked.workspace
        sent = StripeMirror.objects.filter(entry__workspace_id=workspace.pk).aggregate(
            total=Sum("amount_cents")
        )["total"]
        deployment = deployment_id()
        customer = _client().v1.customers.create(
            params={
                "name": workspace.name,
                "balance": -(sent or 0),  # Stripe's customer balance: a credit is negative
                "metadata": {"workspace": workspace.public_id, "veri_deployment": deployment},
            },
            options={
                "idempotency_key": f"veri-{deployment}-customer-{workspace.public_id}-{mode}"
                f"-{replacing or 'first'}-{sent or 0}"
            },
        )
        BillingAccount.objects.filter(pk=account.pk).update(
            stripe_customer_id=customer.id, stripe_customer_mode=mode
        )
    account.stripe_customer_id, account.stripe_customer_mode = customer.id, mode
    return customer.id


def _with_customer(account: BillingAccount, call):
    """`call(customer_id)`, and once more with a new customer when Stripe does not know the one
    Veri has (a key switched to another mode or account): never a top-up failing for good, or
    the mirror stalling, on `resource_missing`."""
    customer = ensure_customer(account)
    try:
        return call(customer)
    except stripe.InvalidRequestError as exc:
        if not _is_missing_customer(exc, customer):
            raise
    return call(_new_customer(account, replacing=customer))


# Checkout


@dataclass(frozen=True, slots=True)
class NewCheckout:
    session_id: str
    url: str
    livemode: bool


def create_checkout(
    *, account: BillingAccount, amount_cents: int, success_url: str, cancel_url: str
) -> NewCheckout:
    """A Stripe Checkout page that tops the workspace up by `amount_cents` when paid. The
    session and its PaymentIntent carry the workspace (and this deployment), so that the payment,
    its refunds and its disputes can be attributed. Raises `StripeUnavailable` or
    `StripeRefused`."""
    workspace_id = account.workspace.public_id
    tags = {"workspace": workspace_id, "veri_deployment": deployment_id()}

    def create(customer: str):
        return _client().v1.checkout.sessions.create(
            params={
                "mode": "payment",
                "customer": customer,
                "client_reference_id": workspace_id,
                "line_items": [
                    {
                        "quantity": 1,
                        "price_data": {
                            "currency": CURRENCY,
                            "unit_amount": amount_cents,
                            "product_data": {"name": "Veri credit"},
                        },
                    }
                ],
                "metadata": tags,
                "payment_intent_data": {"metadata": tags},
                "success_url": success_url,
                "cancel_url": cancel_url,
            }
        )

    try:
        session = _with_customer(account, create)
    except stripe.StripeError as exc:
        raise _answer(exc, "create the Checkout page") from exc
    return NewCheckout(session.id, session.url, bool(session.livemode))


# The balance mirror


def mirror_key(*, entry: LedgerEntry, customer_id: str, generation: int) -> str:
    """The idempotency key of `entry`'s balance transaction: this deployment's, this customer's,
    and the `generation`th (a new one only once Stripe's window for the last has passed)."""
    key = f"veri-{deployment_id()}-ledger-{entry.pk}-{customer_id}"
    return f"{key}-{generation}" if generation else key


def mirror_amount(
    *, account: BillingAccount, entry: LedgerEntry, cents: int, generation: int = 0
) -> str:
    """`cents` (a credit positive, as in the ledger) added to the Stripe customer balance, where a
    credit is negative, for `entry`. Stripe's idempotency key makes a retry with the same amount,
    or a concurrent twin, one transaction. Raises `MirrorFailed` when Stripe does not take it."""

    def send(customer: str):
        return _client().v1.customers.balance_transactions.create(
            customer,
            params={
                "amount": -cents,
                "currency": CURRENCY,
                "description": f"{entry.kind}: {entry.description}"[:350],
                "metadata": {
                    "ledger_entry": str(entry.pk),
                    "key": entry.idempotency_key,
                    "veri_deployment": deployment_id(),
                },
            },
            options={
                "idempotency_key": mirror_key(
                    entry=entry, customer_id=customer, generation=generation
                )
            },
        )

    try:
        return _with_customer(account, send).id
    except stripe.StripeError as exc:
        raise MirrorFailed(_message(exc), stored=exc.http_status == 500) from exc


def find_mirrored(*, account: BillingAccount, entry: LedgerEntry, scan: int = 1000) -> str | None:
    """The balance transaction that mirrors `entry`, if Stripe has one (a request answered 500
    may still have taken effect): looked up by the metadata every mirrored transaction carries,
    among the customer's newest `scan`. Raises `MirrorFailed` when Stripe cannot be asked."""
    try:
        listing = _client().v1.customers.balance_transactions.list(
            ensure_customer(account), params={"limit": 100}
        )
        for index, txn in enumerate(listing.auto_paging_iter()):
            if index >= scan:
                break
            metadata = txn.to_dict().get("metadata") or {}
            tags = (metadata.get("ledger_entry"), metadata.get("veri_deployment"))
            if tags == (str(entry.pk), deployment_id()):
                return txn.id
    except stripe.StripeError as exc:
        raise MirrorFailed(_message(exc)) from exc
    return None


# Webhook events

EVENT_ID_RE = re.compile(r"evt_[A-Za-z0-9]{1,100}")
OBJECT_ID_RE = re.compile(r"[a-z]{2,6}_[A-Za-z0-9_]{1,200}")
WORKSPACE_ID_RE = re.compile(r"ws_[0-9a-z]{1,40}")


@dataclass(frozen=True, slots=True)
class Event:
    id: str
    type: str
    livemode: bool
    api_version: str
    object: dict
    raw: dict


@dataclass(frozen=True, slots=True)
class Checkout:
    session_id: str
    workspace_id: str | None
    deployment: str | None
    payment_intent: str
    payment_status: str
    amount_cents: int
    currency: str


@dataclass(frozen=True, slots=True)
class Refund:
    refund_id: str
    payment_intent: str
    amount_cents: int
    currency: str
    status: str


@dataclass(frozen=True, slots=True)
class Dispute:
    dispute_id: str
    payment_intent: str
    amount_cents: int
    currency: str
    status: str
    reason: str


def verify_event(*, payload: bytes, signature: str | None) -> Event | None:
    """The event a webhook body carries, or None for a signed body that is not an event Veri can
    key (no usable id or type: acknowledged and ignored, never a crash). Raises `BadSignature`
    unless the body carries our endpoint secret's signature (Stripe's `v1` scheme, within the
    `stripe` package's default tolerance of 5 minutes)."""
    secret = settings.STRIPE_WEBHOOK_SECRET
    try:
        if not secret:
            raise stripe.SignatureVerificationError("no secret", signature)
        stripe.WebhookSignature.verify_header(
            payload.decode("utf-8"), signature, secret, stripe.Webhook.DEFAULT_TOLERANCE
        )
        raw = json.loads(payload)
    except (stripe.SignatureVerificationError, ValueError, RecursionError):
        raise BadSignature("the signature does not verify") from None
    return parse_event(raw)


def parse_event(raw) -> Event | None:
    """A verified body (or a recorded one) as an Event, or None when it is not one Veri can key."""
    if not isinstance(raw, dict):
        return None
    event_id, event_type, data = raw.get("id"), raw.get("type"), _dig(raw, "data", "object")
    if (
        not isinstance(event_id, str)
        or not EVENT_ID_RE.fullmatch(event_id)
        or not isinstance(event_type, str)
        or len(event_type) > 100
        or data is None
    ):
        return None
    api_version = raw.get("api_version")
    return Event(
        id=event_id,
        type=event_type,
        livemode=raw.get("livemode") is True,
        api_version=api_version[:40] if isinstance(api_version, str) else "",
        object=data,
        raw=raw,
    )


def _dig(value, *keys: str) -> dict | None:
    for key in keys:
        value = value.get(key) if isinstance(value, dict) else None
    return value if isinstance(value, dict) else None


def _id(obj: dict, field: str, *, required: bool = True) -> str:
    value = obj.get(field)
    if isinstance(value, dict):  # an expanded object
        value = value.get("id")
    if value is None and not required:
        return ""
    if not isinstance(value, str) or not OBJECT_ID_RE.fullmatch(value):
        raise Unreadable(f"its {field} is not a Stripe id")
    return value


def _cents(obj: dict, field: str) -> int:
    value = obj.get(field)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise Unreadable(f"its {field} is not an amount")
    return value


def _currency(obj: dict) -> str:
    value = obj.get("currency")
    if not isinstance(value, str) or not re.fullmatch(r"[a-z]{3}", value):
        raise Unreadable("its currency is not a currency code")
    return value


def _word(obj: dict, field: str) -> str:
    value = obj.get(field)
    return value[:60] if isinstance(value, str) else ""


def read_checkout(obj: dict) -> Checkout:
    metadata = obj.get("metadata") if isinstance(obj.get("metadata"), dict) else {}
    workspace_id = metadata.get("workspace") or obj.get("client_reference_id")
    if workspace_id is not None and (
        not isinstance(workspace_id, str) or not WORKSPACE_ID_RE.fullmatch(workspace_id)
    ):
        raise Unreadable("its workspace is not a workspace id")
    deployment = metadata.get("veri_deployment")
    return Checkout(
        session_id=_id(obj, "id"),
        workspace_id=workspace_id,
        deployment=deployment if isinstance(deployment, str) else None,
        payment_intent=_id(obj, "payment_intent", required=False),
        payment_status=_word(obj, "payment_status"),
        amount_cents=_cents(obj, "amount_total"),
        currency=_currency(obj),
    )


def read_refund(obj: dict) -> Refund:
    return Refund(
        refund_id=_id(obj, "id"),
        payment_intent=_id(obj, "payment_intent", required=False),
        amount_cents=_cents(obj, "amount"),
        currency=_currency(obj),
        status=_word(obj, "status"),
    )


def read_dispute(obj: dict) -> Dispute:
    return Dispute(
        dispute_id=_id(obj, "id"),
        payment_intent=_id(obj, "payment_intent", required=False),
        amount_cents=_cents(obj, "amount"),
        currency=_currency(obj),
        status=_word(obj, "status"),
        reason=_word(obj, "reason"),
    )


def refunds_of_charge(charge: dict) -> list[Refund]:
    """Every refund of the charge a `charge.refunded` event carries, as Stripe has them now (its
    events leave the charge's `refunds` out). Raises `StripeUnavailable` or `StripeRefused`."""
    charge_id = _id(charge, "id")
    try:
        listing = _client().v1.refunds.list(params={"charge": charge_id, "limit": 100})
        return [read_refund(refund.to_dict()) for refund in listing.auto_paging_iter()]
    except stripe.StripeError as exc:
        raise _answer(exc, f"list the refunds of {charge_id}") from exc
