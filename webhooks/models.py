"""Webhook endpoints a workspace registers, the outbox of deliveries owed to them, and the log of
every attempt. Signing secrets are kept sealed (`webhooks.signing`), never in clear."""

from django.db import models

from veri.models import Workspace, public_id_field


class WebhookEndpoint(models.Model):
    public_id = public_id_field("we")
    workspace = models.ForeignKey(
        Workspace, on_delete=models.CASCADE, related_name="webhook_endpoints"
    )
    url = models.URLField(max_length=2000)
    description = models.CharField(max_length=500, blank=True)
    # The event types it receives; empty: all of them.
    event_types = models.JSONField(default=list, blank=True)
    # `whsec_…`, sealed with AES-GCM (webhooks.signing): a database dump alone cannot sign.
    secret_sealed = models.TextField(editable=False)
    secret_hint = models.CharField(max_length=20, editable=False)
    # After a rotation that keeps the old secret for a while, deliveries carry both signatures.
    previous_secret_sealed = models.TextField(blank=True, editable=False)
    previous_secret_expires_at = models.DateTimeField(null=True, blank=True, editable=False)
    enabled = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"{self.url} ({self.public_id})"

    def receives(self, event_type: str) -> bool:
        return self.enabled and (not self.event_types or event_type in self.event_types)


class WebhookDelivery(models.Model):
    """One event owed to one endpoint: written in the publisher's transaction, delivered by a
    task after it commits. Pending while neither `delivered_at` nor `failed_at` is set."""

    endpoint = models.ForeignKey(
        WebhookEndpoint, on_delete=models.CASCADE, related_name="deliveries"
    )
    event_id = models.CharField(max_length=40)
    event_type = models.CharField(max_length=100)
    # The envelope exactly as sent, so every attempt posts the same bytes.
    payload = models.TextField()
    attempt_count = models.PositiveSmallIntegerField(default=0)
    # When the next attempt is due; a claimed attempt pushes it past its own timeout, so a task
    # that dies mid-attempt is retried by the sweep.
    next_attempt_at = models.DateTimeField()
    delivered_at = models.DateTimeField(null=True, blank=True)
    failed_at = models.DateTimeField(null=True, blank=True)
    last_status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    last_error = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        verbose_name_plural = "webhook deliveries"
        indexes = [
            models.Index(
                fields=["next_attempt_at"],
                condition=models.Q(delivered_at__isnull=True, failed_at__isnull=True),
                name="webhook_delivery_pending",
            )
        ]

    def __str__(self) -> str:
        return f"{self.event_type} {self.event_id} → {self.endpoint_id}"

    @property
    def status(self) -> str:
        if self.delivered_at:
            return "delivered"
        return "failed" if self.failed_at else "pending"


class WebhookAttempt(models.Model):
    delivery = models.ForeignKey(WebhookDelivery, on_delete=models.CASCADE, related_name="attempts")
    started_at = models.DateTimeField()
    duration_ms = models.PositiveIntegerField()
    status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    error = models.TextField(blank=True)
    response_excerpt = models.TextField(blank=True)

    def __str__(self) -> str:
        return f"{self.delivery_id} at {self.started_at}: {self.status_code or self.error}"
