"""Operators read endpoints and the delivery log; changes go through the API or the dashboard
(which validate URLs and keep secrets sealed). Secrets are never shown here."""

from django.contrib import admin

from webhooks.models import WebhookAttempt, WebhookDelivery, WebhookEndpoint


class ReadOnly(admin.ModelAdmin):
    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False


@admin.register(WebhookEndpoint)
class WebhookEndpointAdmin(ReadOnly):
    list_display = ["url", "public_id", "workspace", "enabled", "created_at"]
    list_filter = ["enabled"]
    search_fields = ["url", "public_id", "workspace__name", "workspace__public_id"]
    list_select_related = ["workspace"]
    fields = [
        "public_id",
        "workspace",
        "url",
        "description",
        "event_types",
        "enabled",
        "secret_hint",
        "created_at",
        "updated_at",
    ]


class WebhookAttemptInline(admin.TabularInline):
    model = WebhookAttempt
    extra = 0
    fields = ["started_at", "duration_ms", "status_code", "error", "response_excerpt"]
    readonly_fields = fields
    can_delete = False
    max_num = 0


@admin.register(WebhookDelivery)
class WebhookDeliveryAdmin(ReadOnly):
    list_display = [
        "event_id",
        "event_type",
        "endpoint",
        "status",
        "attempt_count",
        "last_status_code",
        "created_at",
    ]
    search_fields = ["event_id", "event_type", "endpoint__public_id", "endpoint__url"]
    list_select_related = ["endpoint"]
    inlines = [WebhookAttemptInline]
