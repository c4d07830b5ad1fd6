"""django-q2 tasks of the tenancy core."""

from veri import idempotency


def forget_old_idempotency_keys() -> int:
    """Hourly: answered (or abandoned) Idempotency-Keys older than a day go."""
    return idempotency.forget_old_keys()
