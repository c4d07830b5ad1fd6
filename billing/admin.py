from django.contrib import admin

from billing.models import BillingAccount


@admin.register(BillingAccount)
class BillingAccountAdmin(admin.ModelAdmin):
    list_display = ["workspace", "created_at"]
    search_fields = ["workspace__name", "workspace__public_id"]
    list_select_related = ["workspace"]
    autocomplete_fields = ["workspace"]
