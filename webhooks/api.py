"""`/v1/webhook_endpoints`: register, list, change, remove, rotate, test, and the delivery log."""

import json

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiExample, extend_schema, extend_schema_field
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from veri.api import WorkspaceView, list_schema, paginate
from webhooks import selectors, services
from webhooks.models import WebhookAttempt, WebhookDelivery, WebhookEndpoint


class EndpointOut(serializers.ModelSerializer):
    id = serializers.CharField(source="public_id")
    object = serializers.SerializerMethodField()
    signing_secret_hint = serializers.CharField(source="secret_hint")
    event_types = serializers.ListField(child=serializers.CharField())

    class Meta:
        model = WebhookEndpoint
        fields = [
            "id",
            "object",
            "url",
            "description",
            "event_types",
            "enabled",
            "signing_secret_hint",
            "created_at",
            "updated_at",
        ]

    def get_object(self, endpoint: WebhookEndpoint) -> str:
        return "webhook_endpoint"


class EndpointWithSecretOut(EndpointOut):
    signing_secret = serializers.SerializerMethodField(
        help_text="`whsec_…`: answered here only, when created or rotated"
    )

    class Meta(EndpointOut.Meta):
        fields = [*EndpointOut.Meta.fields, "signing_secret"]

    def get_signing_secret(self, endpoint: WebhookEndpoint) -> str:
        return self.context["secret"]


def _with_secret(endpoint: WebhookEndpoint, secret: str) -> dict:
    return EndpointWithSecretOut(endpoint, context={"secret": secret}).data


class AttemptOut(serializers.ModelSerializer):
    class Meta:
        model = WebhookAttempt
        fields = ["started_at", "duration_ms", "status_code", "error", "response_excerpt"]


class DeliveryOut(serializers.ModelSerializer):
    id = serializers.CharField(source="event_id", help_text="the event's id (`webhook-id`)")
    type = serializers.CharField(source="event_type")
    status = serializers.ChoiceField(["pending", "delivered", "failed"])
    payload = serializers.SerializerMethodField()
    attempts = AttemptOut(many=True)

    class Meta:
        model = WebhookDelivery
        fields = [
            "id",
            "type",
            "status",
            "attempt_count",
            "next_attempt_at",
            "delivered_at",
            "failed_at",
            "last_status_code",
            "last_error",
            "created_at",
            "payload",
            "attempts",
        ]

    @extend_schema_field(OpenApiTypes.OBJECT)
    def get_payload(self, delivery: WebhookDelivery) -> dict:
        return json.loads(delivery.payload)


class EndpointScopedView(WorkspaceView):
    def endpoint(self, endpoint_id: str) -> WebhookEndpoint:
        return selectors.get_endpoint(workspace=self.workspace, endpoint_id=endpoint_id)


def event_types_field() -> serializers.ListField:
    return serializers.ListField(
        child=serializers.CharField(max_length=100),
        max_length=100,
        required=False,
        help_text="the event types it receives; empty or absent: every event",
    )


class WebhookEndpointsView(WorkspaceView):
    class CreateIn(serializers.Serializer):
        url = serializers.CharField(max_length=2000)
        event_types = event_types_field()
        description = serializers.CharField(max_length=500, required=False, allow_blank=True)

    @list_schema(EndpointOut, name="WebhookEndpointPage", operation_id="webhook_endpoints_list")
    def get(self, request: Request) -> Response:
        endpoints = selectors.list_endpoints(workspace=self.workspace)
        return paginate(request, endpoints, EndpointOut)

    @extend_schema(
        request=CreateIn,
        responses={201: EndpointWithSecretOut},
        examples=[
            OpenApiExample(
                "Job outcomes",
                {
                    "url": "https://example.com/hooks/veri",
                    "event_types": ["training_job.completed", "training_job.failed"],
                },
                request_only=True,
            )
        ],
    )
    def post(self, request: Request) -> Response:
        data = self.validated(self.CreateIn, request.data)
        endpoint, secret = services.create_endpoint(workspace=self.workspace, **data)
        return Response(_with_secret(endpoint, secret), status=201)


class WebhookEndpointView(EndpointScopedView):
    class UpdateIn(serializers.Serializer):
        url = serializers.CharField(max_length=2000, required=False)
        event_types = event_types_field()
        description = serializers.CharField(max_length=500, required=False, allow_blank=True)
        enabled = serializers.BooleanField(required=False)

    @extend_schema(responses=EndpointOut)
    def get(self, request: Request, endpoint_id: str) -> Response:
        return Response(EndpointOut(self.endpoint(endpoint_id)).data)

    @extend_schema(request=UpdateIn, responses=EndpointOut)
    def patch(self, request: Request, endpoint_id: str) -> Response:
        endpoint = self.endpoint(endpoint_id)
        data = self.validated(self.UpdateIn, request.data)
        return Response(EndpointOut(services.update_endpoint(endpoint=endpoint, **data)).data)

    @extend_schema(responses={204: None})
    def delete(self, request: Request, endpoint_id: str) -> Response:
        services.delete_endpoint(endpoint=self.endpoint(endpoint_id))
        return Response(status=204)


class RotateSecretView(EndpointScopedView):
    class RotateIn(serializers.Serializer):
        keep_old_secret_active_for_24_hours = serializers.BooleanField(required=False)

    @extend_schema(request=RotateIn, responses=EndpointWithSecretOut)
    def post(self, request: Request, endpoint_id: str) -> Response:
        endpoint = self.endpoint(endpoint_id)
        data = self.validated(self.RotateIn, request.data)
        endpoint, secret = services.rotate_secret(
            endpoint=endpoint,
            keep_old_for_24_hours=data.get("keep_old_secret_active_for_24_hours", False),
        )
        return Response(_with_secret(endpoint, secret))


class TestEventView(EndpointScopedView):
    @extend_schema(request=None, responses={202: DeliveryOut})
    def post(self, request: Request, endpoint_id: str) -> Response:
        delivery = services.send_test(endpoint=self.endpoint(endpoint_id))
        return Response(DeliveryOut(delivery).data, status=202)


class DeliveriesView(EndpointScopedView):
    @list_schema(DeliveryOut, name="WebhookDeliveryPage", operation_id="webhook_deliveries_list")
    def get(self, request: Request, endpoint_id: str) -> Response:
        deliveries = selectors.list_deliveries(endpoint=self.endpoint(endpoint_id))
        return paginate(request, deliveries, DeliveryOut)
