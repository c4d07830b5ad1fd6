"""Every change of money: ledger entries, job and storage charges, refunds and their review.

Each entry carries an idempotency key named after what it pays for (`job_charge:<job>`), unique
in the database: a task that runs twice, or twice at once, writes it once."""

import logging
from collections.abc import Callable
from datetime import UTC, date, datetime, time, timedelta
from urllib.parse import urlsplit

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Min, Sum
from django.utils import timezone

from billing import selectors, stripe_gateway
from billing.models import (
    AttributionChange,
    BillingAccount,
    JobBilling,
    LedgerEntry,
    Refund,
    StripeCheckout,
)
from training import errors
from training.models import TrainingJob
from training.services import events
from veri.errors import Conflict, PaymentRequired, VeriError
from veri.models import Workspace
from veri.money import micros_from_usd, usd
from volumes.models import UsageSnapshot

log = logging.getLogger(__name__)
K = LedgerEntry.Kind
R = Refund.Status


def open_billing_account(*, workspace: Workspace, credit_micros: int = 0) -> BillingAccount:
    """The workspace's account (made once), and a starting credit once, as an adjustment."""
    account, _ = BillingAccount.objects.get_or_create(workspace=workspace)
    if credit_micros:
        record_entry(
            workspace=workspace,
            kind=K.ADJUSTMENT,
            amount_micros=credit_micros,
            key=f"opening_credit:{workspace.public_id}",
            description="starting credit",
        )
    return account


def record_entry(
    *,
    workspace: Workspace,
    kind: str,
    amount_micros: int,
    key: str,
    description: str = "",
    job: TrainingJob | None = None,
    volume_ref: str = "",
    refund: Refund | None = None,
    created_by=None,
) -> tuple[LedgerEntry, bool]:
    """Write one ledger entry once: a second call with the same key (a rerun, a concurrent twin)
    returns the first entry and False. The unique key decides, not a check before the insert."""
    try:
        with transaction.atomic():
            entry = LedgerEntry.objects.create(
                workspace=workspace,
                kind=kind,
                amount_micros=amount_micros,
                idempotency_key=key,
                description=description[:300],
                job=job,
                volume_ref=volume_ref,
                refund=refund,
                created_by=created_by,
            )
        return entry, True
    except IntegrityError:
        return LedgerEntry.objects.get(idempotency_key=key), False


def charge_deployment_uptime(
    *, workspace: Workspace, amount_micros: int, key: str, description: str
) -> None:
    """Serving's hook: a stretch of a replica's uptime, charged once per key."""
    record_entry(
        workspace=workspace,
        kind=LedgerEntry.Kind.DEPLOYMENT_CHARGE,
        amount_micros=-amount_micros,
        key=key,
        description=description,
    )


def credit_lost_uptime(
    *, workspace: Workspace, amount_micros: int, key: str, description: str
) -> None:
    """Uptime of a machine the platform lost (a replica, a Tinker model), credited back once per
    key."""
    record_entry(
        workspace=workspace,
        kind=LedgerEntry.Kind.REFUND_CREDIT,
        amount_micros=amount_micros,
        key=key,
        description=description,
    )


def credit_hint() -> str:
    """How a workspace gets credit here: a card top-up only where payments are enabled."""
    if stripe_gateway.payments_enabled():
        return "Top up (veri billing top-up AMOUNT)"
    return "Ask an operator for credit (card top-ups are off here)"


def require_serving_funds(*, workspace: Workspace, deploying: bool = False) -> None:
    """Serving's hook, before a deployment starts a replica (`deploying`: created, or given
    replicas to keep) or a request wakes or reaches one: 402 without an account or with a spent
    balance (its deployments are stopped meanwhile)."""
    _require_positive_balance(
        workspace=workspace,
        doing="deploying models",
        spent=f"deploying needs a positive balance. {credit_hint()}, then deploy again."
        if deploying
        else f"this workspace's deployments are stopped. {credit_hint()}; the next request "
        "wakes them.",
    )


def require_tinker_funds(*, workspace: Workspace) -> None:
    """Before a Tinker model starts: 402 without an account or with a spent balance."""
    _require_positive_balance(
        workspace=workspace,
        doing="creating Tinker models",
        spent=f"Tinker models cannot start. {credit_hint()}, then create the training client "
        "again.",
    )


def _require_positive_balance(*, workspace: Workspace, doing: str, spent: str) -> None:
    if not BillingAccount.objects.filter(workspace=workspace).exists():
        raise PaymentRequired(f"This workspace has no billing account; add one before {doing}.")
    balance = balance_micros(workspace=workspace)
    if balance <= 0:
        raise PaymentRequired(
            f"The balance is {usd(balance)} USD: {spent}",
            code="insufficient_balance",
            balance_usd=usd(balance),
        )


def charge_tinker_uptime(
    *, workspace: Workspace, amount_micros: int, key: str, description: str
) -> None:
    """A stretch of a Tinker model's machine uptime, charged once per key."""
    record_entry(
        workspace=workspace,
        kind=K.TINKER_CHARGE,
        amount_micros=-amount_micros,
        key=key,
        description=description,
    )


def _balances(workspace_ids) -> dict[int, int]:
    return dict(
        LedgerEntry.objects.filter(workspace_id__in=list(workspace_ids))
        .values("workspace_id")
        .annotate(total=Sum("amount_micros"))
        .values_list("workspace_id", "total")
    )


def workspaces_spent(*, accrued_micros: dict[int, int]) -> set[int]:
    """Of the workspaces given (id → what is accrued and not charged yet), those whose balance
    less that is at or below zero."""
    balances = _balances(accrued_micros)
    return {ws for ws, owed in accrued_micros.items() if balances.get(ws, 0) - owed <= 0}


def balance_micros(*, workspace: Workspace) -> int:
    total = LedgerEntry.objects.filter(workspace=workspace).aggregate(total=Sum("amount_micros"))
    return total["total"] or 0


def recent_daily_spend_micros(*, workspace: Workspace, days: int = 7) -> int:
    """What the workspace spent per day, on average, over the last `days` days."""
    since = timezone.now() - timedelta(days=days)
    spent = LedgerEntry.objects.filter(
        workspace=workspace,
        created_at__gte=since,
        kind__in=[K.JOB_CHARGE, K.DEPLOYMENT_CHARGE, K.TINKER_CHARGE, K.STORAGE_CHARGE],
    ).aggregate(total=Sum("amount_micros"))["total"]
    return -(spent or 0) // days


def workspaces_out_of_money(*, accrued_micros: dict[int, int], now) -> set[int]:
    """Of the workspaces with running jobs (id → what those jobs accrued, not yet charged), the
    ones whose balance less that has been at or below zero for `VERI_BALANCE_GRACE_SECONDS`.
    When each ran out is kept on its account, and cleared once it has money again."""
    out = list(workspaces_spent(accrued_micros=accrued_micros))
    accounts = BillingAccount.objects.filter(workspace_id__in=list(accrued_micros))
    accounts.filter(workspace_id__in=out, exhausted_since__isnull=True).update(exhausted_since=now)
    accounts.exclude(workspace_id__in=out).filter(exhausted_since__isnull=False).update(
        exhausted_since=None
    )
    cutoff = now - timedelta(seconds=settings.VERI_BALANCE_GRACE_SECONDS)
    return set(
        accounts.filter(workspace_id__in=out, exhausted_since__lt=cutoff).values_list(
            "workspace_id", flat=True
        )
    )


def is_low_balance(*, workspace: Workspace, balance: int, accrued_micros: int) -> bool:
    """The balance, less what unfinished jobs have cost so far, is below one day of the
    workspace's recent spend (or empty)."""
    left = balance - accrued_micros
    return left <= 0 or left < recent_daily_spend_micros(workspace=workspace)


def require_funds(
    *, workspace: Workspace, first_hour_micros: int, held_micros: Callable[[], int]
) -> None:
    """Submit answers 402 unless the balance covers the job's first hour on top of what the
    workspace's unfinished jobs hold (each one's first hour, or its cost so far once more): ten
    jobs cannot start on the money for one.

    Call it inside the transaction that writes the job: it locks the workspace's billing account
    row until that commits, so concurrent submits are checked one after another, each seeing the
    jobs the earlier ones wrote. `held_micros` is a callable, asked after the lock for that
    reason."""
    account = BillingAccount.objects.select_for_update().filter(workspace=workspace).first()
    if account is None:
        raise PaymentRequired(
            "This workspace has no billing account; add one before submitting jobs."
        )
    held = held_micros()
    balance = balance_micros(workspace=workspace)
    if balance - held < first_hour_micros:
        detail = (
            f", of which unfinished jobs hold {usd(held)} USD (each one's first hour, or "
            "what it has cost so far)"
            if held
            else ""
        )
        raise PaymentRequired(
            f"The balance is {usd(balance)} USD{detail}, and this job's first hour is estimated "
            f"at {usd(first_hour_micros)} USD. Top up (veri billing top-up AMOUNT) and re-submit.",
            code="insufficient_balance",
            balance_usd=usd(balance),
            held_usd=usd(held),
            estimate_usd=usd(first_hour_micros),
        )


# Jobs


def lock_job_billing(*, job: TrainingJob) -> JobBilling:
    """Billing's record of the job, made once and locked until the caller's transaction ends:
    what serializes charging, crediting and re-attributing one job (training's row is not
    billing's to lock)."""
    JobBilling.objects.get_or_create(job=job)  # a concurrent twin's insert: got, not doubled
    return JobBilling.objects.select_for_update().get(job=job)


def charge_job(*, job: TrainingJob) -> LedgerEntry | None:
    """The job's attributed cost, charged once; `billing_deducted_at` says it is done (also when
    there was nothing to charge). The job is read with its billing record (`settle_job_money`)."""
    entry = None
    cost = selectors.job_cost_micros(job=job)
    if cost:
        entry, _ = record_entry(
            workspace=job.workspace,
            kind=K.JOB_CHARGE,
            amount_micros=-cost,
            key=f"job_charge:{job.pk}",
            job=job,
            description=f"{job.public_id}: {job.gpu_count}x {job.gpu_type} on {job.provider}",
        )
    JobBilling.objects.filter(job=job, billing_deducted_at__isnull=True).update(
        billing_deducted_at=timezone.now()
    )
    return entry


def refund_decision(*, job: TrainingJob) -> str | None:
    """What the catalog says about money back for how this job ended, and nothing else does:
    platform faults credited at once (or reviewed first, as the catalog marks them), unclear ones
    reviewed, the customer's own charged."""
    if not job.error_code or not selectors.job_cost_micros(job=job):
        return None
    entry = errors.get(job.error_code)
    if entry.billing == errors.Billing.NONE or job.error_attribution == errors.Attribution.CUSTOMER:
        return None
    if (
        job.error_attribution == errors.Attribution.PENDING
        or entry.billing == errors.Billing.REVIEW
    ):
        return R.PENDING
    return R.CREDITED


def refund_if_due(*, job: TrainingJob) -> Refund | None:
    decision = refund_decision(job=job)
    if decision is None:
        return None
    refund, created = _open_refund(job)
    if decision == R.CREDITED:
        return credit_refund(refund_id=refund.pk)
    if created:
        events.record_event(
            job_id=job.pk,
            type="refund_pending",
            detail={"amount_usd": usd(refund.amount_micros), "reason": job.error_code},
        )
    return refund


def _open_refund(job: TrainingJob) -> tuple[Refund, bool]:
    """The job's refund: its charge, less what was already credited for restarted runs' lost
    compute (so a job never gets back more than it paid)."""
    lost_credited = LedgerEntry.objects.filter(
        job=job, idempotency_key__startswith=f"lost_compute:{job.pk}:"
    ).aggregate(total=Sum("amount_micros"))["total"]
    try:
        with transaction.atomic():
            refund = Refund.objects.create(
                workspace=job.workspace,
                job=job,
                amount_micros=selectors.job_cost_micros(job=job) - (lost_credited or 0),
                reason_code=job.error_code,
                status=R.PENDING,
            )
        return refund, True
    except IntegrityError:
        return Refund.objects.get(job=job), False


def settle_job_money(*, job_id: int) -> None:
    """At a job's terminal state, after its cost is attributed: charge it, then credit or queue
    its refund. Safe to run twice, or twice at once."""
    job = TrainingJob.objects.select_related("workspace", "billing").get(pk=job_id)
    record = selectors.job_billing(job=job)
    if record is None or record.cost_attributed_at is None:
        return
    charge_job(job=job)
    credit_lost_compute(job=job)
    refund_if_due(job=job)


def credit_lost_compute(*, job: TrainingJob) -> int:
    """Each restarted run's compute after its last checkpoint (part of the job's charge), credited
    back once; returns the total credited."""
    credited, cost = 0, selectors.job_cost_micros(job=job) or 0
    for attempt in job.attempts.all():
        amount = min(attempt.lost_micros, cost - credited)
        if amount <= 0:
            continue
        since = f"after step {attempt.checkpoint_step}" if attempt.checkpoint_step else "in full"
        record_entry(
            workspace=job.workspace,
            kind=K.REFUND_CREDIT,
            amount_micros=amount,
            key=f"lost_compute:{job.pk}:{attempt.number}",
            job=job,
            description=f"{job.public_id} run {attempt.number}: lost to {attempt.cause}, {since}",
        )
        credited += amount
    return credited


@transaction.atomic
def credit_refund(
    *, refund_id: int, reviewer=None, reason: str = "", reopen_denied: bool = False
) -> Refund:
    """Pending (or approved) → credited, with one `refund_credit` entry and a `job_refunded`
    event. A credited refund is returned as it is, and so is a denied one unless `reopen_denied`
    (only an operator's re-attribution reverses a denial). The status is read under the row lock,
    so a denial committed a moment earlier is always seen."""
    refund = Refund.objects.select_for_update().select_related("job", "workspace").get(pk=refund_id)
    if refund.status == R.CREDITED:
        return refund
    if refund.status == R.DENIED and not reopen_denied:
        return refund
    now = timezone.now()
    record_entry(
        workspace=refund.workspace,
        kind=K.REFUND_CREDIT,
        amount_micros=refund.amount_micros,
        key=f"refund_credit:{refund.job_id}",
        job=refund.job,
        refund=refund,
        description=f"{refund.job.public_id}: {refund.reason_code}",
        created_by=reviewer,
    )
    refund.status, refund.credited_at = R.CREDITED, now
    refund.decided_at = refund.decided_at or now
    refund.reviewer = reviewer or refund.reviewer
    refund.decision_reason = reason or refund.decision_reason
    refund.save()
    events.record_event(
        job_id=refund.job_id,
        type="job_refunded",
        detail={"amount_usd": usd(refund.amount_micros), "reason": refund.reason_code},
    )
    return refund


@transaction.atomic
def approve_refund(*, refund_id: int, reviewer, reason: str = "") -> Refund:
    """The operator's approval: the credit is written in the same transaction. A refund denied
    before the approval took its lock stays denied (409)."""
    refund = credit_refund(refund_id=refund_id, reviewer=reviewer, reason=reason)
    if refund.status == R.DENIED:
        raise Conflict(
            "This refund was denied; re-attribute the job to credit it.", code="refund_decided"
        )
    return refund


@transaction.atomic
def deny_refund(*, refund_id: int, reviewer, reason: str) -> Refund:
    if not reason or not reason.strip():
        raise VeriError("A denial needs a reason the customer can read.", field="reason")
    refund = Refund.objects.select_for_update().get(pk=refund_id)
    if refund.status == R.DENIED:
        return refund
    if refund.status != R.PENDING:
        raise Conflict(f"This refund is already {refund.status}.", code="refund_decided")
    refund.status, refund.decided_at = R.DENIED, timezone.now()
    refund.reviewer, refund.decision_reason = reviewer, reason.strip()
    refund.save()
    events.record_event(
        job_id=refund.job_id, type="refund_denied", detail={"reason": refund.decision_reason}
    )
    return refund


def reattribute_job(*, job_id: int, attribution: str, reason: str, changed_by) -> Refund | None:
    """An operator decides whose fault a failure was; the change is recorded and re-drives the
    refund: platform → credited, customer → a pending refund is denied, pending → reviewed.
    A credited refund stands (money back is never taken back silently)."""
    if attribution not in errors.Attribution.__members__.values():
        raise VeriError(f"Unknown attribution {attribution!r}.", field="attribution")
    if not reason or not reason.strip():
        raise VeriError("A re-attribution needs a reason.", field="reason")
    reason = reason.strip()
    # One transaction under the lock of billing's record of the job: two re-attributions at
    # once, or one racing a review, apply one after the other, each seeing the refund (and the
    # attribution) the other left, so the job is read again once the lock is held.
    with transaction.atomic():
        record = lock_job_billing(job=TrainingJob.objects.get(pk=job_id))
        job = TrainingJob.objects.select_related("workspace").get(pk=job_id)
        job.billing = record
        if not job.error_code:
            raise Conflict(f"{job.public_id} did not fail; there is nothing to attribute.")
        refund = Refund.objects.select_for_update().filter(job=job).first()
        if refund and refund.status == R.CREDITED and attribution != errors.Attribution.PLATFORM:
            raise Conflict(
                f"{job.public_id} was already credited; correct it with an adjustment entry.",
                code="refund_decided",
            )
        AttributionChange.objects.create(
            job=job,
            from_attribution=job.error_attribution,
            to_attribution=attribution,
            reason=reason,
            changed_by=changed_by,
        )
        events.change_attribution(job_id=job.pk, attribution=attribution, reason=reason)
        job.error_attribution = attribution
        if not record.cost_micros:
            return refund
        if attribution == errors.Attribution.PLATFORM:
            refund = refund or _open_refund(job)[0]
            return credit_refund(
                refund_id=refund.pk, reviewer=changed_by, reason=reason, reopen_denied=True
            )
        if attribution == errors.Attribution.CUSTOMER:
            if refund and refund.status == R.PENDING:
                return deny_refund(refund_id=refund.pk, reviewer=changed_by, reason=reason)
            return refund
        return refund or _open_refund(job)[0]


def add_credit(*, workspace: Workspace, amount_micros: int, reason: str, key: str, created_by=None):
    """An operator's (or `create_workspace --credit`'s) credit, as an `adjustment` entry."""
    return record_entry(
        workspace=workspace,
        kind=K.ADJUSTMENT,
        amount_micros=amount_micros,
        key=key,
        description=reason,
        created_by=created_by,
    )[0]


# Top-ups and Stripe


MIN_TOP_UP_CENTS, MAX_TOP_UP_CENTS = 500, 1_000_000  # 5 to 10,000 USD


def top_up_url(*, workspace: Workspace, amount_usd, return_url: str) -> str:
    """A Stripe Checkout URL for a top-up; the money arrives with Stripe's paid-checkout event.
    Stripe sends the customer back to `return_url`'s path on `VERI_PUBLIC_URL` (the address
    customers reach this deployment at), never to the scheme and host the request came in with,
    which behind a TLS proxy are the proxy's `http://`. Raises `StripeUnavailable` (503) or
    `StripeRefused` (502) when Stripe does not make the page."""
    cents = micros_from_usd(amount_usd) // 10_000
    if not MIN_TOP_UP_CENTS <= cents <= MAX_TOP_UP_CENTS:
        raise VeriError(
            f"amount_usd must be from {usd(MIN_TOP_UP_CENTS * 10_000)} to "
            f"{usd(MAX_TOP_UP_CENTS * 10_000)}.",
            field="amount_usd",
        )
    if not stripe_gateway.payments_enabled():
        raise Conflict(
            "Payments are disabled on this deployment (no Stripe key); an operator adds credit.",
            code="payments_disabled",
        )
    account = BillingAccount.objects.select_related("workspace").filter(workspace=workspace).first()
    if account is None:
        raise PaymentRequired(
            "This workspace has no billing account; an operator opens one before it can top up."
        )
    back = settings.VERI_PUBLIC_URL.rstrip("/") + (urlsplit(return_url).path or "/")
    checkout = stripe_gateway.create_checkout(
        account=account,
        amount_cents=cents,
        success_url=f"{back}?top_up=paid",
        cancel_url=f"{back}?top_up=cancelled",
    )
    StripeCheckout.objects.get_or_create(
        session_id=checkout.session_id,
        defaults={"workspace": workspace, "amount_cents": cents, "livemode": checkout.livemode},
    )
    return checkout.url


# Storage

GIB = 1024**3
HOURS_PER_MONTH = 730
STORAGE_CATCH_UP_DAYS = 31  # how far back a run looks for days not charged yet


def charge_storage_due(*, today: date, days: int = STORAGE_CATCH_UP_DAYS) -> int:
    """Charge every finished day (UTC) of the last `days` whose storage is not charged yet, so a
    day the daily run missed is charged by the next one; days before the oldest snapshot (the
    oldest volume's creation) are skipped. Returns how many charges were written."""
    since = datetime.combine(today - timedelta(days=days), time.min, tzinfo=UTC)
    oldest = UsageSnapshot.objects.filter(hour__gte=since).aggregate(oldest=Min("hour"))["oldest"]
    if oldest is None:
        return 0
    charged, day = 0, oldest.astimezone(UTC).date()
    while day < today:
        charged += charge_storage(day=day)
        day += timedelta(days=1)
    return charged


def charge_storage(*, day: date) -> int:
    """Charge each volume's storage on `day` (UTC) from its hourly usage snapshots, per GiB-month
    at `VERI_STORAGE_PRICE_PER_GIB_MONTH`: once per (volume, day), whenever this runs. A deleted
    volume has no snapshots after its deletion, so it stops accruing there."""
    start = datetime.combine(day, time.min, tzinfo=UTC)
    end = start + timedelta(days=1)
    price = micros_from_usd(settings.VERI_STORAGE_PRICE_PER_GIB_MONTH)
    usage = list(
        UsageSnapshot.objects.filter(hour__gte=start, hour__lt=end)
        .values("workspace_id", "volume_ref")
        .annotate(byte_hours=Sum("total_bytes"))
    )
    keys = {
        row["volume_ref"]: f"storage_charge:{row['volume_ref']}:{day.isoformat()}" for row in usage
    }
    # A catch-up run revisits charged days: skip those volumes rather than fail their inserts.
    done = set(
        LedgerEntry.objects.filter(idempotency_key__in=keys.values()).values_list(
            "idempotency_key", flat=True
        )
    )
    charged = 0
    for row in usage:
        micros = row["byte_hours"] * price // (GIB * HOURS_PER_MONTH)
        key = keys[row["volume_ref"]]
        if micros <= 0 or key in done:
            continue
        _, created = record_entry(
            workspace=Workspace.objects.get(pk=row["workspace_id"]),
            kind=K.STORAGE_CHARGE,
            amount_micros=-micros,
            key=key,
            volume_ref=row["volume_ref"],
            description=f"storage of {row['volume_ref']} on {day.isoformat()}",
        )
        charged += created
    return charged
