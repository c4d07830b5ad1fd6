"""Operators unlock a sign-in from the admin: Axes › Access attempts, select the account's (or the
address's) rows, "Unlock". The rows are the counted failures; without them nothing is locked."""

from axes.admin import AccessAttemptAdmin
from axes.models import AccessAttempt
from django.contrib import admin


class UnlockingAccessAttemptAdmin(AccessAttemptAdmin):
    actions = [*AccessAttemptAdmin.actions, "unlock"]

    @admin.action(description="Unlock: forget these failed sign-ins", permissions=["delete"])
    def unlock(self, request, queryset):
        who = sorted({f"{a.username or '?'} from {a.ip_address}" for a in queryset})
        count, _ = queryset.delete()
        self.message_user(request, f"Unlocked {', '.join(who)} ({count} record(s) removed).")


if admin.site.is_registered(AccessAttempt):
    admin.site.unregister(AccessAttempt)
admin.site.register(AccessAttempt, UnlockingAccessAttemptAdmin)
