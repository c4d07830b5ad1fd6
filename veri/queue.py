"""Handing work to the task cluster. The database records what is owed (queued jobs, ended jobs
not yet settled, deleted volumes) and the watchdog re-queues what the broker lost, so a broker
that is down when a request commits delays that work; it never fails the request."""

import logging

from django.db import transaction
from django_q.tasks import async_task

log = logging.getLogger(__name__)


def enqueue_on_commit(func: str, **kwargs) -> None:
    """Queue `func(**kwargs)` once the current transaction commits (at once outside one)."""
    transaction.on_commit(lambda: _enqueue(func, kwargs))


def _enqueue(func: str, kwargs: dict) -> None:
    try:
        async_task(func, **kwargs)
    except Exception:  # noqa: BLE001 - any broker failure: the watchdog re-queues it
        log.warning("could not queue %s%s; the watchdog will", func, kwargs, exc_info=True)
