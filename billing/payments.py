"""Money that moves through Stripe: top-ups credited from Stripe's signed events, refunds and
disputes taking that credit back, and the ledger mirrored to the Stripe customer balance.

The ledger entries are keyed by the Stripe object they account for, under the paying Checkout
Session (`stripe:<cs>:top_up`, `stripe:<cs>:refund:<re>`, `stripe:<cs>:dispute:<dp>`, …), never
by the event that reported it: Stripe may send one object's change more than once, or in two
Event objects. Each is written under the workspace's billing account row lock, and what a
payment gives back (refunds, holds) never exceeds what it credited."""

import logging
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import F, Min, Sum
from django.utils import timezone

from billing import stripe_gateway as gateway
from billing.models import (
    BillingAccount,
    LedgerEntry,
    StripeCheckout,
    StripeDispute,
    StripeEvent,
    StripeMirror,
    StripeMirrorRetry,
)
from billing.services import MAX_TOP_UP_CENTS, record_entry
from veri.models import Workspace
from veri.money import cents_half_up, usd

log = logging.getLogger(__name__)
K = LedgerEntry.Kind
Out = StripeEvent.Outcome
CENT = 10_000  # micro-dollars


@dataclass(frozen=True, slots=True)
class Outcome:
    outcome: str
    detail: str
    workspace: Workspace | None = None


def applied(detail: str, workspace: Workspace | None = None) -> Outcome:
    return Outcome(Out.APPLIED, detail, workspace)


def ignored(detail: str, workspace: Workspace | None = None) -> Outcome:
    return Outcome(Out.IGNORED, detail, workspace)


def unapplied(detail: str, workspace: Workspace | None = None) -> Outcome:
    return Outcome(Out.UNAPPLIED, detail, workspace)


# Webhook


def handle_webhook(*, payload: bytes, signature: str | None) -> StripeEvent | None:
    """Apply one signed webhook delivery. Raises `BadSignature` (nothing written) and
    `StripeUnavailable` (nothing written; Stripe resends). An event already applied or ignored
    is not applied again (Stripe delivers at least once); one Veri could not apply is tried
    again (an operator may have fixed its cause, then resent it from the Stripe Dashboard).
    Returns the event's record, or None for an event type Veri does not consume."""
    event = gateway.verify_event(payload=payload, signature=signature)
    if event is None:
        log.warning("a signed Stripe webhook that is not an event Veri can read was ignored")
        return None
    if event.type not in HANDLERS:
        return None
    seen = StripeEvent.objects.filter(event_id=event.id).first()
    if seen is not None and seen.outcome != Out.UNAPPLIED:
        StripeEvent.objects.filter(pk=seen.pk).update(deliveries=F("deliveries") + 1)
        return seen
    return record_event(event, apply_event(event))


def apply_event(event: gateway.Event) -> Outcome:
    """What `event` does to the ledger, as an outcome; never raises for its content."""
    mode = gateway.key_mode()
    if event.livemode != (mode == "live"):
        return unapplied(
            f"A {'live' if event.livemode else 'test'}-mode event, but STRIPE_SECRET_KEY is a "
            f"{mode} key: test and live money never mix. Check the webhook endpoint's secret."
        )
    try:
        return HANDLERS[event.type](event)
    except gateway.Unreadable as exc:
        return unapplied(f"Unreadable {event.type}: {exc}.")


def record_event(event: gateway.Event, outcome: Outcome, *, delivered: bool = True) -> StripeEvent:
    """The event's record, written once per event id (a redelivery of one not applied before
    updates it). Unapplied ones are logged too, for whoever watches the logs."""
    if outcome.outcome == Out.UNAPPLIED:
        log.warning("Stripe event %s (%s) not applied: %s", event.id, event.type, outcome.detail)
    values = {
        "type": event.type,
        "livemode": event.livemode,
        "api_version": event.api_version,
        "object_id": str(event.object.get("id", ""))[:255],
        "workspace": outcome.workspace,
        "outcome": outcome.outcome,
        "detail": outcome.detail[:500],
        "payload": event.raw,
    }
    try:
        with transaction.atomic():
            record, created = StripeEvent.objects.get_or_create(event_id=event.id, defaults=values)
    except IntegrityError:  # a concurrent delivery of the same event wrote it first
        return StripeEvent.objects.get(event_id=event.id)
    if not created:
        for name, value in values.items():
            setattr(record, name, value)
        record.deliveries += delivered
        record.save()
    return record


def reapply_event(*, event_id: str) -> StripeEvent:
    """An operator's "apply again" for a recorded event Veri could not apply (after fixing its
    cause, e.g. opening the workspace's billing account)."""
    record = StripeEvent.objects.get(event_id=event_id)
    if record.outcome != Out.UNAPPLIED:
        return record
    event = gateway.parse_event(record.payload)
    if event is None or event.type not in HANDLERS:
        return record
    return record_event(event, apply_event(event), delivered=False)


# Checkout: the top-up itself


def _checkout_event(event: gateway.Event) -> Outcome:
    """`checkout.session.completed` credits a session that is paid; one completed `unpaid`
    (a delayed payment method) waits for `checkout.session.async_payment_succeeded`, which
    credits it, or `…_failed`, which credits nothing. Once per session, in any order."""
    paid = gateway.read_checkout(event.object)
    if paid.deployment and paid.deployment != gateway.deployment_id():
        return ignored(f"Another Veri deployment's Checkout ({paid.deployment}).")
    if paid.workspace_id is None:
        return ignored("Not a Veri top-up: the Checkout Session names no workspace.")
    workspace = Workspace.objects.filter(public_id=paid.workspace_id).first()
    if workspace is None:
        return unapplied(
            f"The Checkout Session {paid.session_id} names workspace {paid.workspace_id}, which "
            "this deployment does not have."
        )
    if paid.currency != gateway.CURRENCY:
        return unapplied(
            f"{paid.session_id} was paid in {paid.currency.upper()}; this deployment credits "
            f"{gateway.CURRENCY.upper()} only. Refund it in Stripe, or credit the workspace by "
            "hand.",
            workspace,
        )
    if not 0 < paid.amount_cents <= MAX_TOP_UP_CENTS:
        return unapplied(
            f"{paid.session_id}: {usd(paid.amount_cents * CENT)} USD is outside the top-up range "
            f"(up to {usd(MAX_TOP_UP_CENTS * CENT)} USD).",
            workspace,
        )
    with transaction.atomic():
        account = _lock_account(workspace)
        if account is None:
            return unapplied(f"{workspace.public_id} has no billing account.", workspace)
        checkout, _ = StripeCheckout.objects.get_or_create(
            session_id=paid.session_id,
            defaults={"workspace": workspace, "amount_cents": paid.amount_cents},
        )
        checkout = StripeCheckout.objects.select_for_update().get(pk=checkout.pk)
        if checkout.workspace_id != workspace.pk:
            return unapplied(
                f"{paid.session_id} was made for another workspace than the {workspace.public_id} "
                "its event names.",
                workspace,
            )
        checkout.payment_intent_id = checkout.payment_intent_id or paid.payment_intent
        checkout.livemode = event.livemode
        checkout.currency = paid.currency
        succeeded = event.type in (
            "checkout.session.completed",
            "checkout.session.async_payment_succeeded",
        )
        if succeeded and paid.payment_status == "paid":
            return _credit_checkout(checkout, paid, event)
        checkout.save()
        if event.type == "checkout.session.async_payment_failed":
            if checkout.entry_id is not None:
                return unapplied(
                    f"Stripe reports the payment of {paid.session_id} failed after it was "
                    "credited: take the credit back by hand if it is true.",
                    workspace,
                )
            StripeCheckout.objects.filter(pk=checkout.pk).update(
                status=StripeCheckout.Status.FAILED
            )
            return ignored(f"The delayed payment of {paid.session_id} failed: nothing credited.")
        if checkout.status == StripeCheckout.Status.OPEN:
            StripeCheckout.objects.filter(pk=checkout.pk).update(
                status=StripeCheckout.Status.PROCESSING
            )
        return ignored(
            f"{paid.session_id} completed with payment {paid.payment_status or 'unknown'}: "
            "credited when Stripe reports the payment succeeded.",
            workspace,
        )


def _credit_checkout(checkout: StripeCheckout, paid: gateway.Checkout, event) -> Outcome:
    workspace = checkout.workspace
    if checkout.entry_id is not None:
        checkout.save()
        return applied(f"{paid.session_id} was already credited.", workspace)
    if LedgerEntry.objects.filter(idempotency_key=f"stripe:{event.id}").exists():
        checkout.save()  # credited by this very event before top-ups were keyed by session
        return applied(f"{event.id} was already credited.", workspace)
    entry, _ = record_entry(
        workspace=workspace,
        kind=K.TOP_UP,
        amount_micros=paid.amount_cents * CENT,
        key=f"stripe:{paid.session_id}:top_up",
        description=f"top-up paid through Stripe ({paid.session_id})",
    )
    checkout.entry, checkout.status = entry, StripeCheckout.Status.PAID
    checkout.amount_cents = paid.amount_cents
    checkout.save()
    return applied(f"Credited {usd(entry.amount_micros)} USD for {paid.session_id}.", workspace)


def _lock_account(workspace: Workspace) -> BillingAccount | None:
    """The workspace's billing account, row-locked until the transaction ends: every credit and
    debit of a workspace is written one after another."""
    return BillingAccount.objects.select_for_update().filter(workspace=workspace).first()


# Refunds and disputes: the credit taken back


def _paid_checkout(payment_intent: str) -> StripeCheckout | None:
    if not payment_intent:
        return None
    return (
        StripeCheckout.objects.select_related("workspace")
        .filter(payment_intent_id=payment_intent, entry__isnull=False)
        .first()
    )


def _given_back_micros(checkout: StripeCheckout) -> int:
    """What the payment's refunds and dispute holds have taken back so far (positive)."""
    prefix = f"stripe:{checkout.session_id}:"
    total = (
        LedgerEntry.objects.filter(idempotency_key__startswith=prefix)
        .exclude(kind=K.TOP_UP)
        .aggregate(total=Sum("amount_micros"))["total"]
    )
    return -(total or 0)


def _take_back(checkout: StripeCheckout, *, kind: str, key: str, cents: int, description: str):
    """One negative entry, at most what the payment credited less what was taken back already.
    Returns the entry (None when nothing was left to take), and whether it was new."""
    existing = LedgerEntry.objects.filter(idempotency_key=key).first()
    if existing is not None:
        return existing, False
    room = checkout.entry.amount_micros - _given_back_micros(checkout)
    micros = min(cents * CENT, room)
    if micros <= 0:
        return None, False
    return record_entry(
        workspace=checkout.workspace,
        kind=kind,
        amount_micros=-micros,
        key=key,
        description=description,
    )


def _give_back(taken: LedgerEntry | None, *, kind: str, key: str, description: str):
    """The positive twin of `taken` (a failed refund, a won dispute), once."""
    if taken is None:
        return None, False
    return record_entry(
        workspace=taken.workspace,
        kind=kind,
        amount_micros=-taken.amount_micros,
        key=key,
        description=description,
    )


def _unattributed(kind: str, object_id: str, payment_intent: str) -> Outcome:
    return unapplied(
        f"{kind} {object_id} is of payment {payment_intent or '(none)'}, which is no top-up Veri "
        "credited: nothing was taken back."
    )


REFUND_TAKES = {"pending", "requires_action", "succeeded"}  # money on its way to the customer
REFUND_UNDONE = {"failed", "canceled"}


def _apply_refund(refund: gateway.Refund) -> Outcome:
    checkout = _paid_checkout(refund.payment_intent)
    if checkout is None:
        return _unattributed("Refund", refund.refund_id, refund.payment_intent)
    workspace = checkout.workspace
    if refund.currency != checkout.currency:
        return unapplied(
            f"Refund {refund.refund_id} is in {refund.currency.upper()}, its payment in "
            f"{checkout.currency.upper()}: take the credit back by hand.",
            workspace,
        )
    if refund.status not in REFUND_TAKES | REFUND_UNDONE:
        return unapplied(f"Refund {refund.refund_id} is {refund.status!r}.", workspace)
    base = f"stripe:{checkout.session_id}:refund:{refund.refund_id}"
    with transaction.atomic():
        _lock_account(workspace)
        taken, took = _take_back(
            checkout,
            kind=K.TOP_UP_REFUNDED,
            key=base,
            cents=refund.amount_cents,
            description=f"top-up {checkout.session_id} refunded through Stripe "
            f"({refund.refund_id})",
        )
        if refund.status in REFUND_UNDONE:
            _, gave = _give_back(
                taken,
                kind=K.TOP_UP_REFUNDED,
                key=f"{base}:{refund.status}",
                description=f"Stripe refund {refund.refund_id} {refund.status}: credit restored",
            )
            return applied(f"Refund {refund.refund_id} {refund.status}: nothing taken.", workspace)
    if taken is None:
        return applied(f"Refund {refund.refund_id}: the top-up was given back already.", workspace)
    verb = "Took back" if took else "Already took back"
    return applied(
        f"{verb} {usd(-taken.amount_micros)} USD for refund {refund.refund_id}.", workspace
    )


def _refund_event(event: gateway.Event) -> Outcome:
    """`refund.created`, `refund.updated`, `refund.failed`: the refund as it is now."""
    return _apply_refund(gateway.read_refund(event.object))


def _charge_refunded_event(event: gateway.Event) -> Outcome:
    """`charge.refunded` (any refund of a charge, partial ones too): its event leaves the refunds
    out, so they are listed from Stripe and applied one by one (a refund applied before, through
    its own event, is not applied twice)."""
    try:
        refunds = gateway.refunds_of_charge(event.object)
    except gateway.StripeRefused as exc:  # e.g. a charge of the other mode: an operator looks
        return unapplied(exc.message)
    outcomes = [_apply_refund(refund) for refund in refunds]
    if not outcomes:
        return ignored("The charge has no refunds.")
    worst = next((o for o in outcomes if o.outcome == Out.UNAPPLIED), outcomes[0])
    workspace = next((o.workspace for o in outcomes if o.workspace), None)
    return Outcome(worst.outcome, " ".join(o.detail for o in outcomes), workspace)


DISPUTE_WON = {"won", "warning_closed", "prevented"}


def _dispute_event(event: gateway.Event) -> Outcome:
    """`charge.dispute.created` holds the disputed amount (the balance shows it);
    `charge.dispute.closed` gives it back when the dispute was won (or the inquiry closed),
    keeps it when lost. Each once per dispute, in any order."""
    dispute = gateway.read_dispute(event.object)
    checkout = _paid_checkout(dispute.payment_intent)
    if checkout is None:
        return _unattributed("Dispute", dispute.dispute_id, dispute.payment_intent)
    workspace = checkout.workspace
    if dispute.currency != checkout.currency:
        return unapplied(
            f"Dispute {dispute.dispute_id} is in {dispute.currency.upper()}, its payment in "
            f"{checkout.currency.upper()}: hold the credit by hand.",
            workspace,
        )
    closed = event.type == "charge.dispute.closed"
    outcome = StripeDispute.OPEN
    if closed:
        outcome = StripeDispute.WON if dispute.status in DISPUTE_WON else StripeDispute.LOST
    base = f"stripe:{checkout.session_id}:dispute:{dispute.dispute_id}"
    with transaction.atomic():
        _lock_account(workspace)
        row, _ = StripeDispute.objects.get_or_create(
            dispute_id=dispute.dispute_id,
            defaults={"checkout": checkout, "amount_cents": dispute.amount_cents},
        )
        row = StripeDispute.objects.select_for_update().get(pk=row.pk)
        if row.outcome == StripeDispute.OPEN or closed:
            row.outcome, row.stripe_status = outcome, dispute.status
        row.reason = dispute.reason
        row.save()
        hold, _ = _take_back(
            checkout,
            kind=K.DISPUTE_HOLD,
            key=base,
            cents=dispute.amount_cents,
            description=f"top-up {checkout.session_id} disputed ({dispute.dispute_id}, "
            f"{dispute.reason or 'no reason given'}): held until the dispute closes",
        )
        if row.outcome == StripeDispute.WON:
            _give_back(
                hold,
                kind=K.DISPUTE_RELEASED,
                key=f"{base}:won",
                description=f"dispute {dispute.dispute_id} won: the hold is given back",
            )
    held = usd(-hold.amount_micros) if hold else "0.00"
    detail = {
        StripeDispute.OPEN: f"Holding {held} USD while dispute {dispute.dispute_id} is open.",
        StripeDispute.WON: f"Dispute {dispute.dispute_id} won: {held} USD given back.",
        StripeDispute.LOST: f"Dispute {dispute.dispute_id} lost: {held} USD stays taken.",
    }[row.outcome]
    return applied(detail, workspace)


HANDLERS = {
    "checkout.session.completed": _checkout_event,
    "checkout.session.async_payment_succeeded": _checkout_event,
    "checkout.session.async_payment_failed": _checkout_event,
    "charge.refunded": _charge_refunded_event,
    "refund.created": _refund_event,
    "refund.updated": _refund_event,
    "refund.failed": _refund_event,
    "charge.dispute.created": _dispute_event,
    "charge.dispute.closed": _dispute_event,
}


# The balance mirror


def mirror_to_stripe(*, limit: int = 100) -> int:
    """Mirror up to `limit` ledger entries to their workspaces' Stripe customer balances, each
    in its own transaction, each workspace's oldest first. A workspace whose entry Stripe does
    not take has the failure recorded on its account and waits for the next run; the others go
    on. Returns how many entries were mirrored."""
    if not gateway.payments_enabled():
        return 0
    waiting = (
        LedgerEntry.objects.filter(mirror__isnull=True, workspace__billing_account__isnull=False)
        .values("workspace_id")
        .annotate(oldest=Min("pk"))
        .order_by("oldest")
    )
    mirrored = 0
    for workspace_id in [row["workspace_id"] for row in waiting[:limit]]:
        while mirrored < limit:
            result = _mirror_next_entry(workspace_id=workspace_id)
            if result is None:
                break
            if isinstance(result, str):
                log.warning("mirroring workspace %s to Stripe failed: %s", workspace_id, result)
                BillingAccount.objects.filter(workspace_id=workspace_id).update(
                    stripe_mirror_error=f"{timezone.now():%Y-%m-%d %H:%M}Z: {result}"[:300]
                )
                break
            mirrored += 1
    return mirrored


@transaction.atomic
def _mirror_next_entry(*, workspace_id: int) -> bool | str | None:
    """The workspace's oldest unmirrored entry, sent to Stripe as the whole cents it moves the
    rounded running sum by (nothing is sent for 0). In order, under the account's lock: the
    amount depends on what was mirrored before it, so a retry sends the same amount with the
    same idempotency key. True when mirrored; None when there is nothing to do, or another run
    holds the lock; why not, when Stripe did not take it.

    Stripe keeps a 500 as the answer for its idempotency key: the entry then waits out that
    window, is looked up among the customer's balance transactions (a 500 may have taken
    effect), and is sent under a new key only if it is not there: never twice in effect."""
    account = (
        BillingAccount.objects.select_for_update(skip_locked=True, of=("self",))
        .select_related("workspace")
        .filter(workspace_id=workspace_id)
        .first()
    )
    if account is None:
        return None
    entry = LedgerEntry.objects.filter(workspace_id=workspace_id, mirror__isnull=True)
    entry = entry.order_by("pk").first()
    if entry is None:
        return None
    mirrored_micros = LedgerEntry.objects.filter(
        workspace_id=workspace_id, mirror__isnull=False
    ).aggregate(total=Sum("amount_micros"))["total"]
    sent_cents = StripeMirror.objects.filter(entry__workspace_id=workspace_id).aggregate(
        total=Sum("amount_cents")
    )["total"]
    cents = cents_half_up((mirrored_micros or 0) + entry.amount_micros) - (sent_cents or 0)
    txn = ""
    if cents:
        retry = StripeMirrorRetry.objects.filter(entry=entry).first()
        generation = retry.generation if retry else 0
        try:
            if retry is not None:
                until = retry.failed_at + timedelta(
                    seconds=settings.STRIPE_IDEMPOTENCY_WINDOW_SECONDS
                )
                if timezone.now() < until:
                    return (
                        f"Stripe answered 500 for ledger entry {entry.pk} and keeps that answer "
                        "for its key: it is looked up, then sent again, after "
                        f"{until:%Y-%m-%d %H:%M}Z."
                    )
                txn = gateway.find_mirrored(account=account, entry=entry) or ""
                generation += 1
            txn = txn or gateway.mirror_amount(
                account=account, entry=entry, cents=cents, generation=generation
            )
        except gateway.MirrorFailed as exc:
            if exc.stored:
                StripeMirrorRetry.objects.update_or_create(
                    entry=entry, defaults={"generation": generation, "failed_at": timezone.now()}
                )
            return str(exc)
        StripeMirrorRetry.objects.filter(entry=entry).delete()
    StripeMirror.objects.create(entry=entry, amount_cents=cents, stripe_transaction_id=txn)
    if account.stripe_mirror_error:
        BillingAccount.objects.filter(pk=account.pk).update(stripe_mirror_error="")
    return True
