"""`/v1/billing`: the balance, the ledger, card top-ups, and Stripe's webhook."""

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import permissions, serializers
from rest_framework.request import Request
from rest_framework.response import Response

from billing import payments, selectors, services, stripe_gateway
from billing.models import LedgerEntry
from veri import money
from veri.api import ValidatingView, WorkspaceView, list_schema, paginate
from veri.errors import VeriError


class LedgerEntryOut(serializers.ModelSerializer):
    amount_usd = serializers.SerializerMethodField()
    job_id = serializers.CharField(source="job.public_id", default=None, allow_null=True)
    volume_id = serializers.SerializerMethodField()

    class Meta:
        model = LedgerEntry
        fields = ["kind", "amount_usd", "job_id", "volume_id", "description", "created_at"]

    def get_amount_usd(self, entry: LedgerEntry) -> str:
        return money.usd(entry.amount_micros)

    def get_volume_id(self, entry: LedgerEntry) -> str | None:
        return entry.volume_ref or None  # null when not a volume's, as job_id is


BillingOut = inline_serializer(
    "Billing",
    {
        "balance_usd": serializers.CharField(),
        "low_balance": serializers.BooleanField(),
        "payments_enabled": serializers.BooleanField(),
        "currency": serializers.CharField(),
        "spend_usd": inline_serializer(
            "Spend",
            {
                "jobs": serializers.CharField(),
                "deployments": serializers.CharField(),
                "tinker": serializers.CharField(),
                "storage": serializers.CharField(),
            },
        ),
    },
)


class BillingView(WorkspaceView):
    @extend_schema(responses=BillingOut)
    def get(self, request: Request) -> Response:
        balance = services.balance_micros(workspace=self.workspace)
        return Response(
            {
                "balance_usd": money.usd(balance),
                "low_balance": services.is_low_balance(
                    workspace=self.workspace,
                    balance=balance,
                    accrued_micros=selectors.unbilled(workspace=self.workspace).accrued_micros,
                ),
                "payments_enabled": stripe_gateway.payments_enabled(),
                "currency": "usd",
                # Charged so far, by what for; credits back are the ledger's refund_credit rows.
                "spend_usd": {
                    name: money.usd(micros)
                    for name, micros in selectors.spend_micros(workspace=self.workspace).items()
                },
            }
        )


class LedgerView(WorkspaceView):
    @list_schema(LedgerEntryOut, name="LedgerPage", operation_id="billing_ledger_list")
    def get(self, request: Request) -> Response:
        """Newest first."""
        return paginate(request, selectors.list_ledger(workspace=self.workspace), LedgerEntryOut)


class TopUpsView(WorkspaceView):
    class TopUpIn(serializers.Serializer):
        amount_usd = serializers.DecimalField(max_digits=12, decimal_places=2)

    @extend_schema(
        request=TopUpIn,
        responses={
            201: inline_serializer(
                "TopUp",
                {"checkout_url": serializers.URLField(), "amount_usd": serializers.CharField()},
            )
        },
    )
    def post(self, request: Request) -> Response:
        amount = self.validated(self.TopUpIn, request.data)["amount_usd"]
        try:
            url = services.top_up_url(workspace=self.workspace, amount_usd=amount, return_url="/")
        except stripe_gateway.StripeUnavailable as exc:
            return unavailable(exc)
        return Response({"checkout_url": url, "amount_usd": f"{amount:.2f}"}, status=201)


def unavailable(exc: stripe_gateway.StripeUnavailable) -> Response:
    """503 in the error format, with `Retry-After`: Stripe is away, nothing was done."""
    return Response(
        exc.as_body(), status=exc.status, headers={"Retry-After": str(exc.retry_after_seconds)}
    )


class StripeWebhookView(ValidatingView):
    """Stripe's signed events (no API key: the signature is the credential). A bad signature is
    400 and writes nothing; a replay writes nothing new; types Veri does not consume are
    acknowledged and ignored; an event Veri cannot apply is recorded for an operator and
    acknowledged (200), so Stripe stops resending it. 503 only when Stripe itself could not be
    asked what the event needs (Stripe resends it later)."""

    authentication_classes: list = []
    permission_classes = [permissions.AllowAny]
    parser_classes: list = []  # the signature covers the raw bytes

    @extend_schema(
        request=OpenApiTypes.OBJECT,
        responses=inline_serializer("WebhookAck", {"received": serializers.BooleanField()}),
    )
    def post(self, request: Request) -> Response:
        try:
            payments.handle_webhook(
                payload=request.body, signature=request.headers.get("Stripe-Signature")
            )
        except stripe_gateway.BadSignature:
            raise VeriError(
                "The webhook signature does not verify.", code="invalid_signature"
            ) from None
        except stripe_gateway.StripeUnavailable as exc:
            return unavailable(exc)
        return Response({"received": True})
