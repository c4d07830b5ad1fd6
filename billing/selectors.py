"""Reads of money, always within one workspace (or one of its jobs)."""

from dataclasses import dataclass
from datetime import datetime

from django.db.models import QuerySet, Sum
from django.utils import timezone

from billing.models import JobBilling, LedgerEntry
from providers import catalog
from training.hooks import JobEntry, JobMoney
from training.models import TERMINAL, TrainingJob
from veri.models import Workspace

K = LedgerEntry.Kind


def list_ledger(*, workspace: Workspace) -> QuerySet[LedgerEntry]:
    return LedgerEntry.objects.filter(workspace=workspace).select_related("job")


def replica_charges_micros(*, workspace: Workspace) -> dict[str, int]:
    """What each replica's uptime was charged (positive micros), by the replica's public id: the
    charge's key names it (`deployment_charge:<replica>:<from>`, serving's `charge_uptime`)."""
    charged: dict[str, int] = {}
    entries = list_ledger(workspace=workspace).filter(kind=LedgerEntry.Kind.DEPLOYMENT_CHARGE)
    for key, amount in entries.values_list("idempotency_key", "amount_micros"):
        replica = key.split(":")[1]
        charged[replica] = charged.get(replica, 0) - amount
    return charged


def job_billing(*, job: TrainingJob) -> JobBilling | None:
    """Billing's record of the job (None until its cost is attributed or it is locked for a
    charge); read from the job's cache when it was selected with it."""
    return getattr(job, "billing", None)


def job_cost_micros(*, job: TrainingJob) -> int | None:
    """What the job was charged, once attributed (None before)."""
    record = job_billing(job=job)
    return None if record is None else record.cost_micros


def job_money(*, job: TrainingJob) -> JobMoney:
    record, refund = job_billing(job=job), getattr(job, "refund", None)
    return JobMoney(
        cost_micros=record.cost_micros if record else None,
        cost_attributed_at=record.cost_attributed_at if record else None,
        billing_deducted_at=record.billing_deducted_at if record else None,
        refund_status=refund.status if refund else None,
        refund_micros=refund.amount_micros if refund else None,
        entries=tuple(_job_entry(e) for e in sorted(job.ledgerentry_set.all(), key=_pk)),
    )


def _pk(entry: LedgerEntry) -> int:
    return entry.pk


# An entry's reason, from the idempotency key it was written under (`services.charge_job`,
# `credit_lost_compute`, `credit_refund`).
_REASONS = {"job_charge": "compute", "lost_compute": "lost_compute", "refund_credit": "refund"}


def _job_entry(entry: LedgerEntry) -> JobEntry:
    prefix, *rest = entry.idempotency_key.split(":")
    reason = _REASONS.get(prefix, entry.kind)
    attempt = int(rest[-1]) if reason == "lost_compute" and len(rest) == 2 else None
    return JobEntry(
        kind=entry.kind,
        reason=reason,
        amount_micros=entry.amount_micros,
        description=entry.description,
        at=entry.created_at,
        attempt=attempt,
    )


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


def spend_micros(*, workspace: Workspace) -> dict[str, int]:
    """What the workspace has been charged, by what for (credits back are in the ledger)."""
    kinds = {
        K.JOB_CHARGE: "jobs",
        K.DEPLOYMENT_CHARGE: "deployments",
        K.TINKER_CHARGE: "tinker",
        K.STORAGE_CHARGE: "storage",
    }
    totals = dict(
        LedgerEntry.objects.filter(workspace=workspace, kind__in=list(kinds))
        .values("kind")
        .annotate(total=Sum("amount_micros"))
        .values_list("kind", "total")
    )
    return {name: -(totals.get(kind) or 0) for kind, name in kinds.items()}
