"""What training asks of the money floor above it, without importing it.

Training reports facts (times, attribution, which jobs are active); billing, a higher floor,
turns them into money. Billing registers its implementation when the app loads
(`billing.apps.BillingConfig.ready`), as provider adapters are registered in settings, so the
import graph keeps pointing down: billing imports training, never the reverse."""

from datetime import datetime
from typing import TYPE_CHECKING, Protocol

from django.core.exceptions import ImproperlyConfigured

from veri.models import Workspace

if TYPE_CHECKING:
    from training.models import TrainingJob


class Money(Protocol):
    def check_account(self, *, workspace: Workspace) -> None:
        """Raise PaymentRequired (402) when the workspace cannot be billed at all."""

    def require_funds(self, *, workspace: Workspace, first_hour_micros: int) -> None:
        """Raise PaymentRequired unless the balance covers a new job's first hour. Called inside
        submit's transaction: it locks the workspace's billing account row until that commits."""

    def attributed_cost_micros(self, *, job: "TrainingJob") -> int:
        """What a finished job (its instance terminated) is charged, before refunds."""

    def settle(self, *, job_id: int) -> None:
        """Charge a job whose cost is attributed, credit or queue its refund; idempotent."""

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
