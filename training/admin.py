import json

from django.contrib import admin
from django.utils.html import format_html

from training.models import Checkpoint, Dataset, JobEvent, LogChunk, TrainingJob
from training.services import jobs as job_services


def as_json(value) -> str:
    """A JSON value as an operator reads it (an event's detail, a job's settings), wrapped in
    the page's width: never a Python repr."""
    return format_html('<pre class="veri-json">{}</pre>', json.dumps(value, indent=1, default=str))


class JobEventInline(admin.TabularInline):
    model = JobEvent
    extra = 0
    fields = ["type", "at", "step", "event_detail"]
    readonly_fields = fields
    can_delete = False
    max_num = 0

    @admin.display(description="step")
    def step(self, event: JobEvent):
        return event.detail.get("step", "") if isinstance(event.detail, dict) else ""

    @admin.display(description="detail")
    def event_detail(self, event: JobEvent):
        return as_json(event.detail)


class RecentLogInline(admin.TabularInline):
    model = LogChunk
    extra = 0
    fields = ["seq", "at", "text"]
    readonly_fields = fields
    can_delete = False
    max_num = 0
    verbose_name_plural = "recent log lines (newest 50)"

    def get_queryset(self, request):
        queryset = super().get_queryset(request)
        newest = queryset.order_by("-seq").values_list("pk", flat=True)[:50]
        return queryset.filter(pk__in=list(newest)).order_by("seq")


@admin.register(TrainingJob)
class TrainingJobAdmin(admin.ModelAdmin):
    """Jobs, read-only; operators cancel them here. Billing adds its "Re-attribute" action to this
    page (`billing.admin.BilledTrainingJobAdmin`): training never imports billing."""

    list_display = [
        "public_id",
        "workspace",
        "status",
        "method",
        "provider",
        "gpu_type",
        "region",
        "error_code",
        "last_step",
        "created_at",
    ]
    list_filter = ["status", "method", "provider", "error_attribution", "region"]
    search_fields = [
        "public_id",
        "workspace__name",
        "workspace__public_id",
        "base_model",
        "error_code",
    ]
    list_select_related = ["workspace"]
    readonly_fields = [f.name for f in TrainingJob._meta.fields]
    inlines = [JobEventInline, RecentLogInline]
    actions = ["cancel"]

    def has_add_permission(self, request) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False  # a job is a billed record: its charges and refunds point at it

    @admin.action(description="Cancel selected jobs (terminates their instances now)")
    def cancel(self, request, queryset):
        active = [job for job in queryset.select_related("workspace") if not job.is_terminal]
        for job in active:
            job_services.cancel_job(job=job)
        self.message_user(request, f"Cancelled {len(active)} job(s).")


@admin.register(Dataset)
class DatasetAdmin(admin.ModelAdmin):
    list_display = ["public_id", "workspace", "source", "name", "row_count", "created_at"]
    list_filter = ["source"]
    search_fields = ["public_id", "name", "workspace__name", "hf_repo"]
    list_select_related = ["workspace"]
    readonly_fields = [f.name for f in Dataset._meta.fields]

    def has_add_permission(self, request) -> bool:
        return False


@admin.register(Checkpoint)
class CheckpointAdmin(admin.ModelAdmin):
    list_display = ["public_id", "job", "folder", "step", "final", "size_bytes", "created_at"]
    list_filter = ["final"]
    search_fields = ["public_id", "job__public_id"]
    list_select_related = ["job"]
    readonly_fields = [f.name for f in Checkpoint._meta.fields]

    def has_add_permission(self, request) -> bool:
        return False
