"""Reads of webhooks, always within one workspace: another workspace's endpoint is not found."""

from django.db.models import Prefetch, QuerySet
from django.utils import timezone

from veri.errors import NotFound
from veri.models import Workspace
from webhooks.models import WebhookAttempt, WebhookDelivery, WebhookEndpoint


def list_endpoints(*, workspace: Workspace) -> QuerySet[WebhookEndpoint]:
    return WebhookEndpoint.objects.filter(workspace=workspace)


def get_endpoint(*, workspace: Workspace, endpoint_id: str) -> WebhookEndpoint:
    endpoint = list_endpoints(workspace=workspace).filter(public_id=endpoint_id).first()
    if endpoint is None:
        raise NotFound(f"No webhook endpoint {endpoint_id!r} in this workspace.")
    return endpoint


def list_deliveries(*, endpoint: WebhookEndpoint) -> QuerySet[WebhookDelivery]:
    """Each with its attempts, oldest first (two queries per page)."""
    attempts = Prefetch("attempts", queryset=WebhookAttempt.objects.order_by("pk"))
    return WebhookDelivery.objects.filter(endpoint=endpoint).prefetch_related(attempts)


def due_delivery_ids(*, limit: int) -> list[int]:
    """Pending deliveries whose next attempt is due, most overdue first."""
    due = WebhookDelivery.objects.filter(
        delivered_at=None, failed_at=None, next_attempt_at__lte=timezone.now()
    )
    return list(due.order_by("next_attempt_at").values_list("pk", flat=True)[:limit])
