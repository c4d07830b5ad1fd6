"""The operators' side of money: the refund review queue, credits, and the read-only ledger.
Decisions go through actions, which call services; money rows are never edited in place."""

import uuid

from django import forms
from django.contrib import admin, messages
from django.db.models import Case, IntegerField, Value, When
from django.template.response import TemplateResponse
from django.utils.html import format_html, format_html_join

from billing import payments, selectors, services
from billing.models import (
    AttributionChange,
    BillingAccount,
    LedgerEntry,
    Refund,
    StripeCheckout,
    StripeDispute,
    StripeEvent,
)
from training import errors
from training.admin import TrainingJobAdmin, as_json
from training.models import JobEvent, LogChunk, TrainingJob
from veri import money
from veri.errors import VeriError

REVIEW_PERMISSION = "billing.review_refund"


class ReasonForm(forms.Form):
    reason = forms.CharField(widget=forms.Textarea(attrs={"rows": 3}), strip=True)


class ReattributeForm(ReasonForm):
    attribution = forms.ChoiceField(choices=[(a.value, a.value) for a in errors.Attribution])


class CreditForm(ReasonForm):
    amount_usd = forms.DecimalField(min_value=0.01, max_value=100_000, decimal_places=2)
    token = forms.CharField(widget=forms.HiddenInput)  # one credit per form, however often sent


def _ask(modeladmin, request, queryset, *, form, title: str, action: str, button: str):
    """The page an action shows for what it needs (a reason, an amount) before it acts."""
    return TemplateResponse(
        request,
        "admin/billing/action_form.html",
        {
            **modeladmin.admin_site.each_context(request),
            "title": title,
            "objects": queryset,
            "form": form,
            "action": action,
            "button": button,
            "opts": modeladmin.model._meta,
        },
    )


class ReadOnlyAdmin(admin.ModelAdmin):
    """Money and its decisions: nobody adds, changes or deletes them in place from the admin
    (refunds are decided through actions, which reach the ledger)."""

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False


class ReattributeAction:
    """The "Re-attribute" action for an admin whose rows are failed jobs or lead to one: the form
    (an attribution and a reason) first, then `reattribute_job` for each row's job. Only staff
    with the billing permission see it or can post it."""

    job_id_field = "pk"  # the row's field that holds its job's id

    def has_review_permission(self, request) -> bool:
        return request.user.has_perm(REVIEW_PERMISSION)

    @admin.action(
        description="Re-attribute the selected failures (asks for an attribution and a reason)",
        permissions=["review"],
    )
    def reattribute(self, request, queryset):
        form = ReattributeForm(request.POST if "apply" in request.POST else None)
        if not form.is_valid():
            return _ask(
                self,
                request,
                queryset,
                form=form,
                title="Re-attribute jobs",
                action="reattribute",
                button="Re-attribute",
            )
        done = 0
        for row in queryset:
            try:
                services.reattribute_job(
                    job_id=getattr(row, self.job_id_field),
                    attribution=form.cleaned_data["attribution"],
                    reason=form.cleaned_data["reason"],
                    changed_by=request.user,
                )
                done += 1
            except VeriError as exc:
                self.message_user(request, f"{row}: {exc.message}", messages.ERROR)
        self.message_user(request, f"Re-attributed {done} job(s).")


@admin.register(Refund)
class RefundAdmin(ReattributeAction, ReadOnlyAdmin):
    """The review queue: pending refunds first, oldest first, each with the evidence."""

    list_display = [
        "job",
        "workspace",
        "amount_usd",
        "reason_code",
        "attribution",
        "status",
        "created_at",
    ]
    list_filter = ["status", "reason_code"]
    search_fields = ["job__public_id", "workspace__name", "workspace__public_id"]
    list_select_related = ["job__billing", "workspace"]
    actions = ["approve", "deny", "reattribute"]
    job_id_field = "job_id"
    fields = [
        "job",
        "workspace",
        "status",
        "amount_usd",
        "reason_code",
        "attribution",
        "error_message",
        "job_cost_usd",
        "decision_reason",
        "reviewer",
        "created_at",
        "decided_at",
        "credited_at",
        "recent_events",
        "log_tail",
    ]
    readonly_fields = fields

    def get_queryset(self, request):
        pending_first = Case(
            When(status=Refund.Status.PENDING, then=Value(0)),
            default=Value(1),
            output_field=IntegerField(),
        )
        return super().get_queryset(request).order_by(pending_first, "created_at")

    @admin.display(description="amount")
    def amount_usd(self, refund: Refund) -> str:
        return f"{money.usd(refund.amount_micros)} USD"

    @admin.display(description="attribution")
    def attribution(self, refund: Refund) -> str:
        return refund.job.error_attribution

    @admin.display(description="error")
    def error_message(self, refund: Refund) -> str:
        return f"{refund.job.error_code}: {refund.job.error_message}"

    @admin.display(description="job cost")
    def job_cost_usd(self, refund: Refund) -> str:
        return f"{money.usd(selectors.job_cost_micros(job=refund.job) or 0)} USD"

    @admin.display(description="last events")
    def recent_events(self, refund: Refund):
        events = JobEvent.objects.filter(job=refund.job).order_by("-pk")[:10]
        return format_html(
            "<ul>{}</ul>",
            format_html_join(
                "", "<li>{} {} {}</li>", ((e.at, e.type, as_json(e.detail)) for e in events)
            ),
        )

    @admin.display(description="log tail (last 40 lines)")
    def log_tail(self, refund: Refund):
        lines = LogChunk.objects.filter(job=refund.job).order_by("-seq")[:40]
        return format_html("<pre>{}</pre>", "\n".join(reversed([line.text for line in lines])))

    @admin.action(
        description="Approve selected pending refunds (credit them)", permissions=["review"]
    )
    def approve(self, request, queryset):
        done = 0
        for refund in queryset.filter(status=Refund.Status.PENDING):
            try:  # another operator may have decided it since the page was drawn
                services.approve_refund(refund_id=refund.pk, reviewer=request.user)
                done += 1
            except VeriError as exc:
                self.message_user(request, f"{refund.job}: {exc.message}", messages.ERROR)
        self.message_user(request, f"Approved and credited {done} refund(s).")

    @admin.action(
        description="Deny selected pending refunds (asks for a reason)", permissions=["review"]
    )
    def deny(self, request, queryset):
        pending = queryset.filter(status=Refund.Status.PENDING)
        form = ReasonForm(request.POST if "apply" in request.POST else None)
        if not form.is_valid():
            return _ask(
                self,
                request,
                pending,
                form=form,
                title="Deny refunds",
                action="deny",
                button="Deny",
            )
        done = 0
        for refund in pending:
            try:
                services.deny_refund(
                    refund_id=refund.pk, reviewer=request.user, reason=form.cleaned_data["reason"]
                )
                done += 1
            except VeriError as exc:
                self.message_user(request, f"{refund.job}: {exc.message}", messages.ERROR)
        self.message_user(request, f"Denied {done} refund(s).")


@admin.register(BillingAccount)
class BillingAccountAdmin(admin.ModelAdmin):
    """Read-only but for the one thing an operator may have to change: which Stripe customer the
    account mirrors to (a customer re-created or merged in Stripe). Each change needs a reason,
    kept with the old and new value in the account's History. Money never moves here but through
    the ledger (`Add credit`); the balance is the ledger's sum, not a field. Watchdog state
    (`exhausted_since`, `stripe_mirror_error`) is shown, not edited; accounts are never deleted."""

    class ChangeForm(forms.ModelForm):
        stripe_customer_id = forms.RegexField(
            regex=r"^cus_[A-Za-z0-9]+$",
            required=False,
            max_length=100,
            label="Stripe customer id",
            help_text="cus_…, or empty: a customer is made at the next top-up.",
            error_messages={"invalid": "A Stripe customer id looks like cus_ and letters/digits."},
        )
        reason = forms.CharField(
            widget=forms.Textarea(attrs={"rows": 2}),
            strip=True,
            help_text="Why: kept with the change in this account's History.",
        )

        class Meta:
            model = BillingAccount
            fields = ["workspace", "stripe_customer_id"]

    form = ChangeForm
    list_display = [
        "workspace",
        "balance_usd",
        "stripe_customer_id",
        "stripe_customer_mode",
        "stripe_mirror_error",
        "created_at",
    ]
    search_fields = ["workspace__name", "workspace__public_id"]
    list_select_related = ["workspace"]
    autocomplete_fields = ["workspace"]
    actions = ["add_credit"]
    shown = ["balance_usd", "exhausted_since", "stripe_mirror_error", "created_at"]

    def get_fields(self, request, obj=None):
        if obj is None:  # opening an account for a workspace made without one: no money
            return ["workspace", "stripe_customer_id", "reason"]
        return ["workspace", *self.shown, "stripe_customer_id", "reason"]

    def get_readonly_fields(self, request, obj=None):
        return [] if obj is None else ["workspace", *self.shown]

    def has_delete_permission(self, request, obj=None) -> bool:
        return False  # the ledger and its history stay with the workspace

    def construct_change_message(self, request, form, formsets, add=False):
        """What the History page shows: the changed value, from and to, and the reason."""
        reason = form.cleaned_data["reason"]
        if add:
            return f"Opened the billing account. Reason: {reason}"
        changes = [
            f"{name} from {form.initial.get(name)!r} to {form.cleaned_data[name]!r}"
            for name in form.changed_data
            if name != "reason"
        ]
        return f"Changed {'; '.join(changes) or 'nothing'}. Reason: {reason}"

    def has_credit_permission(self, request) -> bool:
        return request.user.has_perm("billing.add_credit")

    @admin.display(description="balance")
    def balance_usd(self, account: BillingAccount) -> str:
        return f"{money.usd(services.balance_micros(workspace=account.workspace))} USD"

    @admin.action(description="Add credit (an adjustment entry)", permissions=["credit"])
    def add_credit(self, request, queryset):
        data = request.POST if "apply" in request.POST else None
        form = CreditForm(data, initial={"token": uuid.uuid4().hex})
        if not form.is_valid():
            return _ask(
                self,
                request,
                queryset,
                form=form,
                title="Add credit",
                action="add_credit",
                button="Add credit",
            )
        amount = money.micros_from_usd(form.cleaned_data["amount_usd"])
        for account in queryset.select_related("workspace"):
            services.add_credit(
                workspace=account.workspace,
                amount_micros=amount,
                reason=form.cleaned_data["reason"],
                key=f"admin_credit:{form.cleaned_data['token']}:{account.workspace.public_id}",
                created_by=request.user,
            )
        self.message_user(request, f"Credited {queryset.count()} account(s).")


@admin.register(LedgerEntry)
class LedgerEntryAdmin(ReadOnlyAdmin):
    list_display = ["created_at", "workspace", "kind", "amount", "job", "volume_ref", "created_by"]
    list_filter = ["kind"]
    search_fields = ["workspace__name", "workspace__public_id", "idempotency_key"]
    list_select_related = ["workspace", "job", "created_by"]
    readonly_fields = [f.name for f in LedgerEntry._meta.fields]

    @admin.display(description="amount (USD)")
    def amount(self, entry: LedgerEntry) -> str:
        return money.usd(entry.amount_micros)


@admin.register(AttributionChange)
class AttributionChangeAdmin(ReadOnlyAdmin):
    list_display = ["changed_at", "job", "from_attribution", "to_attribution", "changed_by"]
    list_select_related = ["job", "changed_by"]
    readonly_fields = [f.name for f in AttributionChange._meta.fields]


@admin.register(StripeEvent)
class StripeEventAdmin(ReadOnlyAdmin):
    """Every Stripe event Veri consumed and what it did; the ones Veri could not apply first.
    Those were acknowledged to Stripe (so it stops resending) and wrote nothing: fix the cause
    (the detail says it), then "Apply again" here or resend the event from the Stripe Dashboard."""

    list_display = ["received_at", "outcome", "type", "event_id", "workspace", "detail"]
    list_filter = ["outcome", "type", "livemode"]
    search_fields = ["event_id", "object_id", "detail", "workspace__public_id"]
    list_select_related = ["workspace"]
    readonly_fields = [f.name for f in StripeEvent._meta.fields]
    actions = ["apply_again"]

    def get_queryset(self, request):
        unapplied_first = Case(
            When(outcome=StripeEvent.Outcome.UNAPPLIED, then=Value(0)),
            default=Value(1),
            output_field=IntegerField(),
        )
        return super().get_queryset(request).order_by(unapplied_first, "-received_at")

    def has_credit_permission(self, request) -> bool:
        return request.user.has_perm("billing.add_credit")

    @admin.action(
        description="Apply again the selected events Veri could not apply", permissions=["credit"]
    )
    def apply_again(self, request, queryset):
        applied = 0
        for event in queryset.filter(outcome=StripeEvent.Outcome.UNAPPLIED):
            try:
                event = payments.reapply_event(event_id=event.event_id)
            except VeriError as exc:  # Stripe away while the event needs it: try again later
                self.message_user(request, f"{event.event_id}: {exc.message}", messages.ERROR)
                continue
            if event.outcome == StripeEvent.Outcome.UNAPPLIED:
                self.message_user(request, f"{event.event_id}: {event.detail}", messages.ERROR)
            else:
                applied += 1
        self.message_user(request, f"Applied {applied} event(s).")


@admin.register(StripeCheckout)
class StripeCheckoutAdmin(ReadOnlyAdmin):
    """Top-ups through Stripe Checkout: made, processing (a delayed payment), paid or failed."""

    list_display = [
        "created_at",
        "workspace",
        "session_id",
        "amount",
        "status",
        "payment_intent_id",
        "livemode",
    ]
    list_filter = ["status", "livemode"]
    search_fields = ["session_id", "payment_intent_id", "workspace__public_id", "workspace__name"]
    list_select_related = ["workspace"]
    readonly_fields = [f.name for f in StripeCheckout._meta.fields]

    @admin.display(description="amount")
    def amount(self, checkout: StripeCheckout) -> str:
        return f"{money.usd(checkout.amount_cents * 10_000)} {checkout.currency.upper()}"


@admin.register(StripeDispute)
class StripeDisputeAdmin(ReadOnlyAdmin):
    """Disputed top-ups, open ones first: their amount is held in the workspace's ledger
    (`dispute_hold`) until Stripe reports the dispute closed. Evidence is submitted in Stripe."""

    list_display = [
        "created_at",
        "dispute_id",
        "workspace",
        "amount",
        "reason",
        "stripe_status",
        "outcome",
    ]
    list_filter = ["outcome", "reason"]
    search_fields = ["dispute_id", "checkout__session_id", "checkout__workspace__public_id"]
    list_select_related = ["checkout__workspace"]
    readonly_fields = [f.name for f in StripeDispute._meta.fields]

    def get_queryset(self, request):
        open_first = Case(
            When(outcome=StripeDispute.OPEN, then=Value(0)),
            default=Value(1),
            output_field=IntegerField(),
        )
        return super().get_queryset(request).order_by(open_first, "-created_at")

    @admin.display(description="workspace")
    def workspace(self, dispute: StripeDispute):
        return dispute.checkout.workspace

    @admin.display(description="amount")
    def amount(self, dispute: StripeDispute) -> str:
        return f"{money.usd(dispute.amount_cents * 10_000)} {dispute.checkout.currency.upper()}"


# Training's job admin is a lower floor's page: billing adds its re-attribute action to it (a
# failure attributed to the customer has no refund row to act on in the review queue), so that
# training never imports billing.
admin.site.unregister(TrainingJob)


@admin.register(TrainingJob)
class BilledTrainingJobAdmin(ReattributeAction, TrainingJobAdmin):
    actions = [*TrainingJobAdmin.actions, "reattribute"]
