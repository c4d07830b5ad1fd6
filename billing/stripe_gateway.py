"""The only code that talks to Stripe, through the official `stripe` package. Stripe is the payment
edge, never the source of truth: top-ups arrive by signed webhook and become ledger entries; the
ledger is mirrored to the Stripe customer balance. Off while `STRIPE_SECRET_KEY` is unset."""

import json
import re
from dataclasses import dataclass

import stripe
from django.conf import settings

from billing.models import BillingAccount, LedgerEntry


class PaymentsDisabled(Exception):
    """This deployment has no Stripe key: balances are the local ledger only."""


class MirrorFailed(Exception):
    """Stripe did not take a balance transaction (down, refused); it is tried again later."""


class BadSignature(Exception):
    """The webhook's body was not signed with our endpoint secret."""


@dataclass(frozen=True, slots=True)
class PaidCheckout:
    event_id: str
    workspace_id: str
    amount_cents: int


def payments_enabled() -> bool:
    return bool(settings.STRIPE_SECRET_KEY)


def _client() -> stripe.StripeClient:
    if not payments_enabled():
        raise PaymentsDisabled("payments are disabled (STRIPE_SECRET_KEY is unset)")
    base = {"api": settings.STRIPE_API_BASE} if settings.STRIPE_API_BASE else None
    return stripe.StripeClient(
        settings.STRIPE_SECRET_KEY, base_addresses=base, max_network_retries=2
    )


def ensure_customer(account: BillingAccount) -> str:
    """The workspace's Stripe customer, made once (Stripe's idempotency key covers a race)."""
    if account.stripe_customer_id:
        return account.stripe_customer_id
    workspace = account.workspace
    customer = _client().v1.customers.create(
        params={"name": workspace.name, "metadata": {"workspace": workspace.public_id}},
        options={"idempotency_key": f"veri-customer-{workspace.public_id}"},
    )
    BillingAccount.objects.filter(pk=account.pk, stripe_customer_id="").update(
        stripe_customer_id=customer.id
    )
    account.stripe_customer_id = customer.id
    return customer.id


def checkout_url(
    *, account: BillingAccount, amount_cents: int, success_url: str, cancel_url: str
) -> str:
    """A Stripe Checkout page that tops the workspace up by `amount_cents` when paid."""
    workspace_id = account.workspace.public_id
    session = _client().v1.checkout.sessions.create(
        params={
            "mode": "payment",
            "customer": ensure_customer(account),
            "client_reference_id": workspace_id,
            "line_items": [
                {
                    "quantity": 1,
                    "price_data": {
                        "currency": "usd",
                        "unit_amount": amount_cents,
                        "product_data": {"name": "Veri credit"},
                    },
                }
            ],
            "metadata": {"workspace": workspace_id},
            "success_url": success_url,
            "cancel_url": cancel_url,
        }
    )
    return session.url


EVENT_ID_RE = re.compile(r"evt_[A-Za-z0-9]{1,100}")
WORKSPACE_ID_RE = re.compile(r"ws_[0-9a-z]{1,40}")
MAX_EVENT_CENTS = 100_000_000  # a million dollars: more is not a top-up


def paid_checkout(*, payload: bytes, signature: str | None) -> PaidCheckout | None:
    """The paid top-up a webhook announces, or None for any other event (acknowledged and
    ignored, so Stripe does not resend it). Raises `BadSignature` unless the body carries our
    endpoint secret's signature. Even signed, the body is read defensively: anything that is not
    the shape of a paid Checkout session is ignored, never a crash."""
    secret = settings.STRIPE_WEBHOOK_SECRET
    try:
        if not secret:
            raise stripe.SignatureVerificationError("no secret", signature)
        stripe.WebhookSignature.verify_header(
            payload.decode("utf-8"), signature, secret, stripe.Webhook.DEFAULT_TOLERANCE
        )
        event = json.loads(payload)
    except (stripe.SignatureVerificationError, ValueError, RecursionError):
        raise BadSignature("the signature does not verify") from None
    session = _dig(event, "data", "object")
    if not isinstance(event, dict) or event.get("type") != "checkout.session.completed":
        return None
    if session is None or session.get("payment_status") != "paid":
        return None
    metadata = session.get("metadata") if isinstance(session.get("metadata"), dict) else {}
    workspace_id = metadata.get("workspace") or session.get("client_reference_id")
    amount = session.get("amount_total")
    event_id = event.get("id")
    if (
        not isinstance(event_id, str)
        or not EVENT_ID_RE.fullmatch(event_id)
        or not isinstance(workspace_id, str)
        or not WORKSPACE_ID_RE.fullmatch(workspace_id)
        or isinstance(amount, bool)
        or not isinstance(amount, int)
        or not 0 < amount <= MAX_EVENT_CENTS
    ):
        return None
    return PaidCheckout(event_id, workspace_id, amount)


def _dig(value, *keys: str) -> dict | None:
    for key in keys:
        value = value.get(key) if isinstance(value, dict) else None
    return value if isinstance(value, dict) else None


def mirror_amount(*, account: BillingAccount, entry: LedgerEntry, cents: int) -> str:
    """`cents` (a credit positive, as in the ledger) added to the Stripe customer balance, where a
    credit is negative, for `entry`. Stripe's idempotency key makes a retry with the same amount,
    or a concurrent twin, one transaction. Raises `MirrorFailed` when Stripe does not take it."""
    try:
        transaction = _client().v1.customers.balance_transactions.create(
            ensure_customer(account),
            params={
                "amount": -cents,
                "currency": "usd",
                "description": f"{entry.kind}: {entry.description}"[:350],
                "metadata": {"ledger_entry": str(entry.pk), "key": entry.idempotency_key},
            },
            options={"idempotency_key": f"veri-ledger-{entry.pk}"},
        )
    except stripe.StripeError as exc:
        raise MirrorFailed(exc.user_message or str(exc) or type(exc).__name__) from exc
    return transaction.id
