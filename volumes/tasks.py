"""django-q2 tasks for volumes, queued by dotted path and on schedules: each calls one
`volumes.reconciler` service (idempotent, and safe when two runs overlap)."""

from datetime import datetime

from volumes import reconciler


def reconcile_deleted_volumes() -> int:
    """Remove from the store what the database dropped; returns how many objects or prefixes."""
    return reconciler.reconcile_deleted_volumes()


def abort_stale_uploads(*, now: datetime | None = None) -> int:
    return reconciler.abort_stale_uploads(now=now)


def take_usage_snapshots(*, now: datetime | None = None) -> int:
    return reconciler.take_usage_snapshots(now=now)
