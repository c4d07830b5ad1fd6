"""django-q2 tasks for money: idempotent, and safe when two runs overlap."""

from datetime import timedelta

from django.utils import timezone

from billing import services


def mirror_to_stripe() -> int:
    """Every minute: ledger entries not yet on the Stripe customer balance (none while off)."""
    return services.mirror_to_stripe()


def charge_storage() -> int:
    """Daily: yesterday's storage, charged once per volume (a rerun writes nothing new)."""
    yesterday = (timezone.now() - timedelta(days=1)).date()
    return services.charge_storage(day=yesterday)
