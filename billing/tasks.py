"""django-q2 tasks for money: idempotent, and safe when two runs overlap."""

from django.utils import timezone

from billing import payments, services


def mirror_to_stripe() -> int:
    """Every minute: ledger entries not yet on the Stripe customer balance (none while off)."""
    return payments.mirror_to_stripe()


def charge_storage() -> int:
    """Daily: each finished day's storage not charged yet (a missed day is caught up, up to a
    month back), once per volume and day (a rerun writes nothing new)."""
    return services.charge_storage_due(today=timezone.now().date())
