from django.contrib import admin

from serving.models import Deployment, DeploymentEvent, RateLimit, Replica


class ReplicaInline(admin.TabularInline):
    model = Replica
    extra = 0
    fields = [
        "public_id",
        "status",
        "external_id",
        "url",
        "requests",
        "ready_at",
        "stopped_at",
        "error_code",
    ]
    readonly_fields = fields
    can_delete = False
    max_num = 0


class DeploymentEventInline(admin.TabularInline):
    model = DeploymentEvent
    extra = 0
    fields = ["type", "created_at", "detail"]
    readonly_fields = fields
    can_delete = False
    max_num = 0


@admin.register(Deployment)
class DeploymentAdmin(admin.ModelAdmin):
    """Read-only: a deployment changes through its services (the API), never by hand here."""

    list_display = ["public_id", "workspace", "base_model", "status", "provider", "created_at"]
    list_filter = ["status", "provider"]
    search_fields = ["public_id", "base_model", "workspace__name"]
    inlines = [ReplicaInline, DeploymentEventInline]

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_add_permission(self, request) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False


@admin.register(RateLimit)
class RateLimitAdmin(admin.ModelAdmin):
    """An operator's override of a workspace's inference rate limits (empty: the settings')."""

    list_display = ["workspace", "requests_per_minute", "tokens_per_minute"]
    search_fields = ["workspace__name", "workspace__public_id"]
    fields = ["workspace", "requests_per_minute", "tokens_per_minute"]
    autocomplete_fields = ["workspace"]

    def get_readonly_fields(self, request, obj=None):
        return ["workspace"] if obj else []
