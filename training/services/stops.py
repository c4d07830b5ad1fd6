"""Stopping a job for money: its budget (`max_cost_usd`) reached, or its workspace's balance
exhausted past a grace period. The worker is asked (in its heartbeat's answer) to save a
checkpoint and end with the code; one that does not within `VERI_STOP_GRACE_SECONDS` is ended
by the watchdog. A job not yet training has nothing to save: it ends at once."""

from collections.abc import Iterable
from datetime import datetime, timedelta

from django.conf import settings

from billing import services as billing
from training.models import JobEvent, JobStatus, TrainingJob
from training.services.jobs import InvalidTransition, accrued_micros, fail_job
from veri.money import usd

S = JobStatus


def request_stop(*, job: TrainingJob, code: str, message: str, now: datetime) -> bool:
    """Ask once; True when this call asked (a job already asked keeps its first reason)."""
    if job.status != S.RUNNING:
        try:
            fail_job(job_id=job.pk, code=code, message=message)
        except InvalidTransition:
            return False
        return True
    asked = TrainingJob.objects.filter(pk=job.pk, stop_code="").update(
        stop_code=code, stop_message=message, stop_requested_at=now
    )
    if asked:
        JobEvent.objects.create(job=job, type="stop_requested", detail={"code": code})
    return bool(asked)


def enforce(*, active: Iterable[TrainingJob], now: datetime) -> dict[str, int]:
    """One watchdog pass over the active jobs (their instances selected): budgets, balances,
    and stops past their grace. A fixed number of queries however many jobs there are."""
    active = [job for job in active if getattr(job, "instance", None)]
    stopped: dict[str, int] = {}
    # What each job has cost so far: its restarted runs' kept compute, and the run going now.
    accrued = {
        job.pk: job.earlier_kept_micros + accrued_micros(job.instance, at=now) for job in active
    }

    def stop(job: TrainingJob, code: str, message: str) -> None:
        if request_stop(job=job, code=code, message=message, now=now):
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
            f"{settings.VERI_BALANCE_GRACE_SECONDS} s. Top up, then resume from a checkpoint.",
        )
    grace = now - timedelta(seconds=settings.VERI_STOP_GRACE_SECONDS)
    for job in active:
        if job.stop_code and job.stop_requested_at and job.stop_requested_at < grace:
            try:
                fail_job(
                    job_id=job.pk,
                    code=job.stop_code,
                    message=f"{job.stop_message} The worker did not stop within "
                    f"{settings.VERI_STOP_GRACE_SECONDS} s, so it was ended without a checkpoint.",
                )
            except InvalidTransition:
                continue
    return stopped


def _past_grace(active: list[TrainingJob], accrued: dict, now: datetime) -> list[TrainingJob]:
    """Jobs of workspaces out of money for longer than the grace period (see billing)."""
    by_workspace: dict[int, list[TrainingJob]] = {}
    for job in active:
        by_workspace.setdefault(job.workspace_id, []).append(job)
    overdue = billing.workspaces_out_of_money(
        accrued_micros={ws: sum(accrued[j.pk] for j in jobs) for ws, jobs in by_workspace.items()},
        now=now,
    )
    return [job for ws in overdue for job in by_workspace[ws]]
