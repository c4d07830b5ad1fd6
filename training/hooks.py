"""What training asks of the money floor above it, without importing it.

Training reports facts (times, attribution, which jobs are active); billing, a higher floor,
turns them into money. Billing registers its implementation when the app loads
(`billing.apps.BillingConfig.ready`), as provider adapters are registered in settings, so the
import graph keeps pointing down: billing imports training, never the reverse."""

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Protocol

from django.core.exceptions import ImproperlyConfigured

from veri.models import Workspace

if TYPE_CHECKING:
    from training.models import Checkpoint, TrainingJob


@dataclass(frozen=True, slots=True)
class JobEntry:
    """One ledger entry written for the job: its charge, a credit, an operator's adjustment."""

    kind: str  # the ledger's kind: job_charge, refund_credit, adjustment
    # compute (the charge), lost_compute (a restarted run's compute after its last checkpoint),
    # refund (the catalog's refund of a failed job), or the ledger kind for anything else
    reason: str
    amount_micros: int  # charges negative, credits positive
    description: str
    at: datetime
    attempt: int | None = None  # the restarted run a lost_compute credit pays back


@dataclass(frozen=True, slots=True)
class JobMoney:
    """A job's money as billing keeps it, for training's API to show (None: not yet)."""

    cost_micros: int | None = None  # attributed once the job has ended
    cost_attributed_at: datetime | None = None
    billing_deducted_at: datetime | None = None  # charged to the ledger (also when 0)
    refund_status: str | None = None
    refund_micros: int | None = None
    entries: tuple[JobEntry, ...] = ()  # oldest first

    @property
    def credited_micros(self) -> int:
        """Everything credited back for the job so far (lost compute, refund, adjustments)."""
        return sum(e.amount_micros for e in self.entries if e.amount_micros > 0)

    @property
    def net_micros(self) -> int | None:
        """What the job costs once its credits are taken off (None until it is attributed)."""
        return None if self.cost_micros is None else self.cost_micros - self.credited_micros

    def credit_for_attempt(self, number: int) -> int | None:
        """The credit written for a restarted run's lost compute: None until the job is settled,
        0 when settling credited none (the run lost nothing, or the budget cap ate it)."""
        amounts = [e.amount_micros for e in self.entries if e.attempt == number]
        if amounts:
            return sum(amounts)
        return None if self.billing_deducted_at is None else 0


class Money(Protocol):
    def check_account(self, *, workspace: Workspace) -> None:
        """Raise PaymentRequired (402) when the workspace cannot be billed at all."""

    def require_funds(self, *, workspace: Workspace, first_hour_micros: int) -> None:
        """Raise PaymentRequired unless the balance covers a new job's first hour. Called inside
        submit's transaction: it locks the workspace's billing account row until that commits."""

    def attribute_cost(self, *, job: "TrainingJob") -> None:
        """Record, once, what a finished job (its instance terminated) is charged, before
        refunds; billing keeps it on its own record. Idempotent."""

    def job_money(self, *, job: "TrainingJob") -> JobMoney:
        """The job's cost, charge and refund as billing has them; no query when the job was
        read with `training.selectors` (which select billing's record and refund)."""

    def settle(self, *, job_id: int) -> None:
        """Charge a job whose cost is attributed, credit or queue its refund; idempotent."""

    def split_run(
        self,
        *,
        price_per_hour_micros: int,
        launched_at: datetime,
        ended_at: datetime,
        checkpoint_at,
    ) -> tuple[int, int]:
        """(kept, lost) micro-dollars of a run that is restarted: kept up to its last
        checkpoint, lost after it (all of it when the run saved none)."""

    def enforce_stops(self, *, active: list["TrainingJob"], now: datetime) -> dict[str, int]:
        """Ask the active jobs over their budget, or of a workspace out of money, to stop;
        returns how many were asked, by stop code."""


_money: Money | None = None


def register_money(hook: Money) -> None:
    global _money
    _money = hook


def money() -> Money:
    if _money is None:
        raise ImproperlyConfigured("No money hook is registered: is billing in INSTALLED_APPS?")
    return _money


# Faces above training (the OpenAI-compatible one) told, in the ending transaction, that a job
# reached a terminal state: they publish their own events for the jobs they started.
_job_ended: list[Callable[["TrainingJob"], None]] = []


def register_job_ended(callback: Callable[["TrainingJob"], None]) -> None:
    if callback not in _job_ended:
        _job_ended.append(callback)


def job_ended(job: "TrainingJob") -> None:
    for callback in _job_ended:
        callback(job)


# The faces' names for models trained through them (the OpenAI face's `ft:…`, the Tinker face's
# `tinker://…`): the base model such a name was trained on and the checkpoint holding its
# adapter, for deployments and for jobs that train on from it. Each face answers None for a
# name that is not its own.
_fine_tuned: list[Callable[..., "tuple[str, Checkpoint] | None"]] = []
FACE_NAMES = ("ft:", "tinker://")  # how such names start


def register_fine_tuned_names(resolver: Callable[..., "tuple[str, Checkpoint] | None"]) -> None:
    if resolver not in _fine_tuned:
        _fine_tuned.append(resolver)


def fine_tuned_model(*, workspace: Workspace, name: str) -> "tuple[str, Checkpoint] | None":
    for resolver in _fine_tuned:
        if found := resolver(workspace=workspace, name=name):
            return found
    return None


# The other way round: a face's name for a succeeded job's final model (its `ft:…`), or None
# when no face started the job.
_job_names: Callable[["TrainingJob"], str | None] | None = None


def register_job_model_names(namer: Callable[["TrainingJob"], str | None]) -> None:
    global _job_names
    _job_names = namer


def job_model_name(job: "TrainingJob") -> str | None:
    return _job_names(job) if _job_names else None


# Machines the floors above training launch for themselves (serving's replicas), tagged with
# their own ids: each callback maps the tagged ids it owns that are live to their recorded
# instance id, so training's orphan sweeper leaves them running.
_live_machines: list[Callable[[set[str]], dict[str, str | None]]] = []


def register_live_machines(callback: Callable[[set[str]], dict[str, str | None]]) -> None:
    if callback not in _live_machines:
        _live_machines.append(callback)


def live_machines(tagged: set[str]) -> dict[str, str | None]:
    found: dict[str, str | None] = {}
    for callback in _live_machines:
        found |= callback(tagged)
    return found
