"""Stopping a job for money: billing decides (its budget, `max_cost_usd`, reached, or its
workspace's balance exhausted past a grace period; `billing.jobs`), training stops it. The
worker is asked (in its heartbeat's answer) to save a checkpoint and end with the code; one that
does not within `VERI_STOP_GRACE_SECONDS` is ended by the watchdog. A job not yet training has
nothing to save: it ends at once."""

import contextlib
from collections.abc import Iterable
from datetime import datetime, timedelta

from django.conf import settings

from training import hooks
from training.models import JobEvent, JobStatus, TrainingJob
from training.services.jobs import InvalidTransition, cancel_job, fail_job, transition_job
from veri.errors import Conflict

S = JobStatus
# A stop the customer asked for to continue later: the run saves a checkpoint and ends
# cancelled (charged for what it ran); `resume_job` continues from that checkpoint.
PAUSED = "paused"


def pause_job(*, job: TrainingJob, now: datetime) -> TrainingJob:
    """A running job is asked to save a checkpoint and stop; one not yet training has nothing
    to save and is cancelled at once (its cost waived, as any cancel before running)."""
    if job.is_terminal:
        raise Conflict(f"Job {job.public_id} already {job.status}.", code="job_finished")
    if job.status != S.RUNNING:
        return cancel_job(job=job)
    request_stop(job=job, code=PAUSED, message="Paused by the customer.", now=now)
    job.refresh_from_db()
    return job


def end_paused(*, job_id: int) -> TrainingJob:
    """The paused run stopped (or its grace ran out): it ends cancelled, by the customer."""
    return transition_job(job_id=job_id, to=S.CANCELLED, detail={"by": "customer", "paused": True})


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
    """One watchdog pass over the active jobs (their instances selected): billing's money stops
    (budgets, balances; `training.hooks.Money.enforce_stops`), then stops past their grace."""
    active = [job for job in active if getattr(job, "instance", None)]
    stopped = hooks.money().enforce_stops(active=active, now=now)
    grace = now - timedelta(seconds=settings.VERI_STOP_GRACE_SECONDS)
    for job in active:
        if job.stop_code and job.stop_requested_at and job.stop_requested_at < grace:
            if job.stop_code == PAUSED:
                with contextlib.suppress(InvalidTransition):
                    end_paused(job_id=job.pk)
                continue
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
