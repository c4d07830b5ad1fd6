"""`/v1/deployments`: create, list, get, update, delete a deployment, and its events. Thin:
validate, call a service, serialize."""

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from serving import selectors
from serving.models import Deployment, DeploymentEvent
from serving.services import deployments as services
from serving.services import states
from veri.api import WorkspaceView, list_schema, paginate

MAX_NAME = 500


class DeploymentOut(serializers.ModelSerializer):
    id = serializers.CharField(source="public_id")
    adapters = serializers.SerializerMethodField()
    error = serializers.SerializerMethodField()
    replicas = serializers.SerializerMethodField()

    class Meta:
        model = Deployment
        fields = [
            "id",
            "base_model",
            "adapters",
            "gpu_type",
            "gpu_count",
            "provider",
            "region",
            "min_replicas",
            "max_replicas",
            "idle_timeout_seconds",
            "status",
            "error",
            "replicas",
            "last_active_at",
            "created_at",
        ]

    def get_adapters(self, deployment: Deployment) -> list[dict]:
        return deployment.adapters

    def get_error(self, deployment: Deployment) -> dict | None:
        return states.deployment_error(deployment)

    def get_replicas(self, deployment: Deployment) -> list[dict]:
        return [
            {"id": r.public_id, "status": r.status, "ready_at": r.ready_at, "requests": r.requests}
            for r in deployment.replicas.order_by("-pk")[:20]
        ]


class DeploymentEventOut(serializers.ModelSerializer):
    class Meta:
        model = DeploymentEvent
        fields = ["type", "detail", "created_at"]


class DeploymentShapeIn(serializers.Serializer):
    min_replicas = serializers.IntegerField(required=False, min_value=0, max_value=8)
    max_replicas = serializers.IntegerField(required=False, min_value=1, max_value=8)
    idle_timeout_seconds = serializers.IntegerField(
        required=False, min_value=10, max_value=7 * 86400
    )
    adapters = serializers.ListField(
        child=serializers.CharField(max_length=MAX_NAME), required=False, max_length=16
    )


class DeploymentCreateIn(DeploymentShapeIn):
    base_model = serializers.CharField(required=False, max_length=MAX_NAME)
    gpu_type = serializers.CharField(required=False, max_length=60)
    gpu_count = serializers.IntegerField(required=False, min_value=1, max_value=8)
    provider = serializers.CharField(required=False, max_length=30)
    region = serializers.CharField(required=False, max_length=40)


class DeploymentsView(WorkspaceView):
    @list_schema(DeploymentOut, name="DeploymentPage", operation_id="deployments_list")
    def get(self, request: Request) -> Response:
        return paginate(
            request, selectors.list_deployments(workspace=self.workspace), DeploymentOut
        )

    @extend_schema(request=DeploymentCreateIn, responses={201: DeploymentOut})
    def post(self, request: Request) -> Response:
        data = self.validated(DeploymentCreateIn, request.data)
        adapters = data.pop("adapters", [])
        base_model = data.pop("base_model", None)
        deployment = services.create_deployment(
            workspace=self.workspace,
            base_model=base_model,
            adapters=adapters,
            shape=services.Shape(**data),
        )
        return Response(DeploymentOut(deployment).data, status=201)


class DeploymentScopedView(WorkspaceView):
    def deployment(self, deployment_id: str) -> Deployment:
        return selectors.get_deployment(workspace=self.workspace, deployment_id=deployment_id)


class DeploymentView(DeploymentScopedView):
    @extend_schema(responses=DeploymentOut)
    def get(self, request: Request, deployment_id: str) -> Response:
        return Response(DeploymentOut(self.deployment(deployment_id)).data)

    @extend_schema(request=DeploymentShapeIn, responses=DeploymentOut)
    def patch(self, request: Request, deployment_id: str) -> Response:
        data = self.validated(DeploymentShapeIn, request.data)
        adapters = data.pop("adapters", None)
        deployment = services.update_deployment(
            deployment=self.deployment(deployment_id), adapters=adapters, changes=data
        )
        return Response(DeploymentOut(deployment).data)

    @extend_schema(responses={204: None})
    def delete(self, request: Request, deployment_id: str) -> Response:
        services.delete_deployment(deployment=self.deployment(deployment_id))
        return Response(status=204)


class EventsView(DeploymentScopedView):
    @list_schema(DeploymentEventOut, name="DeploymentEventPage", operation_id="deployments_events")
    def get(self, request: Request, deployment_id: str) -> Response:
        events = selectors.list_events(deployment=self.deployment(deployment_id))
        return paginate(request, events, DeploymentEventOut, order_by="pk")
