"""What serving asks of the money floor above it, without importing it: billing registers how a
replica's uptime is charged when the app loads (`billing.apps.BillingConfig.ready`), as it does
training's money hook, so the import graph keeps pointing down."""

from collections.abc import Callable

from veri.models import Workspace

_charge: Callable[..., None] | None = None


def register_uptime_charge(charge: Callable[..., None]) -> None:
    global _charge
    _charge = charge


def charge_uptime(*, workspace: Workspace, amount_micros: int, key: str, description: str) -> None:
    """Charge `amount_micros` of replica uptime once per `key` (a rerun changes nothing)."""
    if _charge is not None:
        _charge(workspace=workspace, amount_micros=amount_micros, key=key, description=description)
