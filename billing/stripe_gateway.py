"""The only code that talks to Stripe, through the official `stripe` package. Stripe is the payment
edge, never the source of truth: top-ups arrive by signed webhook and become ledger entries; the
ledger is mirrored to the Stripe customer balance. Off while `STRIPE_SECRET_KEY` is unset."""

from dataclasses import dataclass

import stripe
from django.conf import settings

from billing.models import BillingAccount, LedgerEntry


class PaymentsDisabled(Exception):
    """This deployment has no Stripe key: balances are the local ledger only."""


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


def paid_checkout(*, payload: bytes, signature: str | None) -> PaidCheckout | None:
    """The paid top-up a webhook announces, or None for any other event (ignored). Raises
    `BadSignature` unless the body carries our endpoint secret's signature."""
    try:
        event = stripe.Webhook.construct_event(
            payload, signature, settings.STRIPE_WEBHOOK_SECRET or ""
        )
    except (stripe.SignatureVerificationError, ValueError) as exc:
        raise BadSignature(str(exc)) from None
    if event.type != "checkout.session.completed":
        return None
    session = event.data.object.to_dict()
    if session.get("payment_status") != "paid":
        return None
    workspace_id = (session.get("metadata") or {}).get("workspace") or session.get(
        "client_reference_id"
    )
    if not workspace_id or not isinstance(session.get("amount_total"), int):
        return None
    return PaidCheckout(event.id, workspace_id, session["amount_total"])


def mirror_entry(*, account: BillingAccount, entry: LedgerEntry) -> str:
    """The entry as a Stripe customer balance transaction (a credit there is negative); Stripe's
    idempotency key makes a retry, or a concurrent twin, one transaction."""
    transaction = _client().v1.customers.balance_transactions.create(
        ensure_customer(account),
        params={
            "amount": -round(entry.amount_micros / 10_000),
            "currency": "usd",
            "description": f"{entry.kind}: {entry.description}"[:350],
            "metadata": {"ledger_entry": str(entry.pk), "key": entry.idempotency_key},
        },
        options={"idempotency_key": f"veri-ledger-{entry.pk}"},
    )
    return transaction.id
