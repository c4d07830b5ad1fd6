from django.contrib import admin

from volumes.models import StoreDeletion, Upload, UsageSnapshot, Volume, VolumeFile


class VolumeFileInline(admin.TabularInline):
    model = VolumeFile
    extra = 0
    fields = ["path", "size", "sha256", "uploaded_at"]
    readonly_fields = fields
    can_delete = False
    show_change_link = False
    max_num = 0  # files arrive through uploads only

    def get_queryset(self, request):
        return super().get_queryset(request).order_by("path")


@admin.register(Volume)
class VolumeAdmin(admin.ModelAdmin):
    list_display = [
        "name",
        "public_id",
        "workspace",
        "region",
        "file_count",
        "total_bytes",
        "created_at",
    ]
    list_filter = ["region", "status"]
    search_fields = ["name", "public_id", "workspace__name", "workspace__public_id"]
    list_select_related = ["workspace"]
    readonly_fields = [
        "public_id",
        "workspace",
        "name",
        "region",
        "status",
        "file_count",
        "total_bytes",
        "created_at",
    ]
    inlines = [VolumeFileInline]

    def has_add_permission(self, request) -> bool:
        return False  # volumes are created through the API, which validates and deduplicates names


@admin.register(Upload)
class UploadAdmin(admin.ModelAdmin):
    list_display = ["path", "public_id", "volume", "method", "size", "status", "created_at"]
    list_filter = ["status", "method"]
    search_fields = ["path", "public_id", "volume__name", "volume__public_id"]
    list_select_related = ["volume"]

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_add_permission(self, request) -> bool:
        return False


@admin.register(UsageSnapshot)
class UsageSnapshotAdmin(admin.ModelAdmin):
    list_display = ["volume", "workspace", "hour", "file_count", "total_bytes"]
    list_filter = ["hour"]
    search_fields = ["volume__name", "volume__public_id", "workspace__name"]
    list_select_related = ["volume", "workspace"]

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_add_permission(self, request) -> bool:
        return False


@admin.register(StoreDeletion)
class StoreDeletionAdmin(admin.ModelAdmin):
    list_display = ["key", "reason", "created_at", "not_before", "done_at", "attempts"]
    list_filter = [("done_at", admin.EmptyFieldListFilter)]
    search_fields = ["key", "reason"]

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_add_permission(self, request) -> bool:
        return False
