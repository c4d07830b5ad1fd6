"""Webhook tasks: each takes ids, claims its rows, and is safe to run twice or concurrently."""

from veri.queue import enqueue_on_commit
from webhooks import selectors, services

SWEEP_LIMIT = 500


def deliver(delivery_id: int) -> None:
    """One attempt at a delivery, if it is due and no other task holds it."""
    services.attempt_delivery(delivery_id=delivery_id)


def deliver_due() -> None:
    """Every minute: queue the retries that are due, and deliveries whose task was lost (the
    broker was down at publish, or a task died mid-attempt and its claim lapsed)."""
    for delivery_id in selectors.due_delivery_ids(limit=SWEEP_LIMIT):
        enqueue_on_commit("webhooks.tasks.deliver", delivery_id=delivery_id)
