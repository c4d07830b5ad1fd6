"""What serving asks of the money floor above it, without importing it: billing registers its
answers when the app loads (`billing.apps.BillingConfig.ready`), as it does training's money
hook, so the import graph keeps pointing down. Serving reports facts (uptime, a replica lost by
the platform, what its replicas accrued); billing decides what they cost."""

from typing import Protocol

from veri.models import Workspace


class Money(Protocol):
    def charge_uptime(
        self, *, workspace: Workspace, amount_micros: int, key: str, description: str
    ) -> None: ...

    def credit_uptime(
        self, *, workspace: Workspace, amount_micros: int, key: str, description: str
    ) -> None: ...

    def require_funds(self, *, workspace: Workspace, deploying: bool = False) -> None: ...

    def out_of_funds(self, *, accrued_micros: dict[int, int]) -> set[int]: ...

    def credit_hint(self) -> str: ...


_money: Money | None = None


def register_money(money: Money) -> None:
    global _money
    _money = money


def charge_uptime(*, workspace: Workspace, amount_micros: int, key: str, description: str) -> None:
    """Charge `amount_micros` of replica uptime once per `key` (a rerun changes nothing)."""
    if _money is not None:
        _money.charge_uptime(
            workspace=workspace, amount_micros=amount_micros, key=key, description=description
        )


def credit_uptime(*, workspace: Workspace, amount_micros: int, key: str, description: str) -> None:
    """Credit back uptime the catalog says the platform owes (a replica it lost), once per key."""
    if _money is not None:
        _money.credit_uptime(
            workspace=workspace, amount_micros=amount_micros, key=key, description=description
        )


def require_funds(*, workspace: Workspace, deploying: bool = False) -> None:
    """Raise PaymentRequired (402) unless the workspace may run replicas now (`deploying`: a
    deployment is created or told to keep replicas, rather than a request waking one)."""
    if _money is not None:
        _money.require_funds(workspace=workspace, deploying=deploying)


def out_of_funds(*, accrued_micros: dict[int, int]) -> set[int]:
    """Of the workspaces given (id → what their replicas accrued, not charged yet), those whose
    balance is spent."""
    return _money.out_of_funds(accrued_micros=accrued_micros) if _money is not None else set()


def credit_hint() -> str:
    """How this workspace gets credit here (a card top-up only where payments are enabled)."""
    return _money.credit_hint() if _money is not None else "Add credit"
