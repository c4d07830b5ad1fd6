"""Reads of money, always within one workspace (or one of its jobs)."""

from dataclasses import dataclass
from datetime import datetime

from django.db.models import QuerySet
from django.utils import timezone

from billing.models import LedgerEntry
from providers import catalog
from training.models import TERMINAL, TrainingJob
from veri.models import Workspace


def list_ledger(*, workspace: Workspace) -> QuerySet[LedgerEntry]:
    return LedgerEntry.objects.filter(workspace=workspace).select_related("job")


def job_accrued_micros(*, job: TrainingJob, at: datetime | None = None) -> int:
    """What a job has cost so far: its restarted runs' kept compute, and the run going now up to
    `at` (by default its machine's termination, or now). The API, the dashboard, the budget
    and the balance stops all read it here; select `instance` with the job to save a query."""
    instance = getattr(job, "instance", None)
    return job.earlier_kept_micros + (instance.accrued_micros(at=at) if instance else 0)


@dataclass(frozen=True, slots=True)
class Unbilled:
    """A workspace's unfinished jobs, in money not yet in its ledger."""

    accrued_micros: int  # what they have cost so far (restarted runs' kept compute included)
    held_micros: int  # each one's first hour at its GPU's price, or its cost so far once more


def unbilled(*, workspace: Workspace, now: datetime | None = None) -> Unbilled:
    now = now or timezone.now()
    accrued = held = 0
    unfinished = TrainingJob.objects.filter(workspace=workspace).exclude(status__in=TERMINAL)
    for job in unfinished.select_related("instance"):
        cost = job_accrued_micros(job=job, at=now)
        spec = catalog.get_provider(job.provider)
        gpu = spec.gpu(job.gpu_type) if spec else None
        first_hour = gpu.price_per_gpu_hour_micros * job.gpu_count if gpu else 0
        accrued, held = accrued + cost, held + max(first_hour, cost)
    return Unbilled(accrued_micros=accrued, held_micros=held)
