"""Money of training jobs: what a finished job is charged, and stopping jobs for money (their
budget, `max_cost_usd`, reached; their workspace's balance exhausted past a grace period).
Training reports the facts; the rules are here, and act through training's services."""

from datetime import datetime

from django.conf import settings
from django.db.models import Sum
from django.utils import timezone

from billing import selectors, services
from billing.models import JobBilling
from providers.models import Instance
from training import errors
from training.models import TrainingJob
from training.services import stops
from veri.money import compute_micros, usd


def attributed_cost_micros(*, job: TrainingJob) -> int:
    """For a finished job whose machine is terminated: its last run's compute (nothing when it
    was cancelled before running or its error code is never billed), plus every restarted
    run's compute, capped at its budget."""
    instance = Instance.objects.filter(job=job).first()  # fresh: terminated just now
    billed = not job.cost_waived and not (
        job.error_code and errors.get(job.error_code).billing == errors.Billing.NONE
    )
    cost = instance.accrued_micros(at=instance.terminated_at) if billed and instance else 0
    # Restarted runs' compute, all of it: what each lost after its checkpoint is credited back
    # when the job settles (services.credit_lost_compute).
    earlier = job.attempts.aggregate(kept=Sum("kept_micros"), lost=Sum("lost_micros"))
    cost += (earlier["kept"] or 0) + (earlier["lost"] or 0)
    if job.max_cost_micros is not None:
        cost = min(cost, job.max_cost_micros)  # a budget is never overrun
    return cost


def attribute_job_cost(*, job: TrainingJob) -> None:
    """At close-out, once: what the finished job is charged, on billing's record of it. A rerun
    (or a concurrent twin) finds it attributed and changes nothing."""
    record, _ = JobBilling.objects.get_or_create(job=job)
    if record.cost_attributed_at is not None:
        return
    cost = attributed_cost_micros(job=job)
    JobBilling.objects.filter(job=job, cost_attributed_at__isnull=True).update(
        cost_micros=cost, cost_attributed_at=timezone.now()
    )


def enforce_stops(*, active: list[TrainingJob], now: datetime) -> dict[str, int]:
    """One watchdog pass over the active jobs (their instances selected): budgets, then
    balances. A fixed number of queries however many jobs there are."""
    stopped: dict[str, int] = {}
    accrued = {job.pk: selectors.job_accrued_micros(job=job, at=now) for job in active}

    def stop(job: TrainingJob, code: str, message: str) -> None:
        if stops.request_stop(job=job, code=code, message=message, now=now):
            stopped[code] = stopped.get(code, 0) + 1

    for job in active:
        if job.max_cost_micros is not None and accrued[job.pk] >= job.max_cost_micros:
            stop(
                job,
                "budget_exceeded",
                f"The job's cost reached its max_cost_usd ({usd(job.max_cost_micros)} "
                "USD); it is charged that and no more.",
            )
    for job in _past_grace(active, accrued, now):
        stop(
            job,
            "balance_exhausted",
            "The workspace's balance ran out (with this job's accrued cost) and stayed out for "
            f"{settings.VERI_BALANCE_GRACE_SECONDS} s. {services.credit_hint()}, then resume "
            "from a checkpoint.",
        )
    return stopped


def _past_grace(active: list[TrainingJob], accrued: dict, now: datetime) -> list[TrainingJob]:
    """Jobs of workspaces out of money for longer than the grace period."""
    by_workspace: dict[int, list[TrainingJob]] = {}
    for job in active:
        by_workspace.setdefault(job.workspace_id, []).append(job)
    overdue = services.workspaces_out_of_money(
        accrued_micros={ws: sum(accrued[j.pk] for j in jobs) for ws, jobs in by_workspace.items()},
        now=now,
    )
    return [job for ws in overdue for job in by_workspace[ws]]


def split_run(
    *, price_per_hour_micros: int, launched_at: datetime, ended_at: datetime, checkpoint_at
) -> tuple[int, int]:
    """(kept, lost) micro-dollars of a restarted run: kept up to its last checkpoint, lost after
    it (all of it when the run saved none); what is lost is credited back when the job settles."""
    kept_until = max(launched_at, min(checkpoint_at or launched_at, ended_at))
    price = price_per_hour_micros
    return (
        compute_micros(price_per_hour_micros=price, start=launched_at, end=kept_until),
        compute_micros(price_per_hour_micros=price, start=kept_until, end=ended_at),
    )
