from django.contrib import admin, messages

from veri import services
from veri.models import ApiKey, Membership, Workspace


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 0
    autocomplete_fields = ["user"]


class ApiKeyInline(admin.TabularInline):
    model = ApiKey
    extra = 0
    fields = ["name", "prefix", "created_at", "last_used_at", "revoked_at"]
    readonly_fields = ["name", "prefix", "created_at", "last_used_at", "revoked_at"]
    can_delete = False

    def has_add_permission(self, request, obj=None) -> bool:
        return False  # keys are minted on the API key page, which shows the secret once


@admin.register(Workspace)
class WorkspaceAdmin(admin.ModelAdmin):
    list_display = ["name", "public_id", "created_at"]
    search_fields = ["name", "public_id"]
    readonly_fields = ["public_id", "created_at"]
    inlines = [MembershipInline, ApiKeyInline]


@admin.register(Membership)
class MembershipAdmin(admin.ModelAdmin):
    list_display = ["user", "workspace", "role", "created_at"]
    list_filter = ["role"]
    search_fields = ["user__username", "user__email", "workspace__name", "workspace__public_id"]
    list_select_related = ["user", "workspace"]
    autocomplete_fields = ["user", "workspace"]


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    list_display = ["__str__", "name", "workspace", "created_at", "last_used_at", "revoked_at"]
    list_filter = [("revoked_at", admin.EmptyFieldListFilter)]
    search_fields = ["prefix", "name", "workspace__name", "workspace__public_id"]
    list_select_related = ["workspace"]
    autocomplete_fields = ["workspace"]
    actions = ["revoke"]

    def get_fields(self, request, obj=None):
        return (
            ["workspace", "name"]
            if obj is None
            else ["workspace", "name", "prefix", "created_at", "last_used_at", "revoked_at"]
        )

    def get_readonly_fields(self, request, obj=None):
        return (
            []
            if obj is None
            else ["workspace", "prefix", "created_at", "last_used_at", "revoked_at"]
        )

    def save_model(self, request, obj, form, change):
        if change:
            obj.save(update_fields=["name"])
            return
        api_key, raw_key = services.create_api_key(workspace=obj.workspace, name=obj.name)
        obj.pk = api_key.pk
        self.message_user(
            request,
            f"API key created. Copy it now, it is not shown again: {raw_key}",
            level=messages.WARNING,
        )

    @admin.action(description="Revoke selected API keys")
    def revoke(self, request, queryset):
        keys = list(queryset.filter(revoked_at__isnull=True))
        for api_key in keys:
            services.revoke_api_key(api_key=api_key)
        self.message_user(request, f"Revoked {len(keys)} key(s).")
