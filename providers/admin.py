from django.contrib import admin

from providers.models import Instance, LaunchAttempt


@admin.register(Instance)
class InstanceAdmin(admin.ModelAdmin):
    list_display = [
        "__str__",
        "job",
        "provider",
        "zone",
        "gpu_type",
        "gpu_count",
        "launched_at",
        "terminated_at",
    ]
    list_filter = ["provider", ("terminated_at", admin.EmptyFieldListFilter)]
    search_fields = ["external_id", "job__public_id"]
    list_select_related = ["job"]
    readonly_fields = [f.name for f in Instance._meta.fields]


@admin.register(LaunchAttempt)
class LaunchAttemptAdmin(admin.ModelAdmin):
    list_display = ["job", "provider", "zone", "outcome", "at"]
    list_filter = ["provider", "outcome"]
    search_fields = ["job__public_id", "message"]
    list_select_related = ["job"]
    readonly_fields = [f.name for f in LaunchAttempt._meta.fields]
