"""`/v1/worker/replicas/{id}/…`: a serving process's side, with its replica token (good for
its own replica only, dead once it stopped). What it sends is hostile input."""

from django.http import HttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import authentication, exceptions, permissions, serializers
from rest_framework.request import Request
from rest_framework.response import Response

from serving.models import Replica
from serving.services import replicas
from training.worker_api import WorkerBootstrapView, bearer_token, bootstrap_manifest
from veri.api import ValidatingView

OK = inline_serializer("ReplicaOk", {"ok": serializers.BooleanField()})


class ReplicaTokenAuthentication(authentication.BaseAuthentication):
    def authenticate(self, request: Request):
        raw = bearer_token(request)
        if raw is None:
            return None
        replica_id = request.parser_context["kwargs"].get("replica_id", "")
        replica = replicas.authenticate(replica_id=replica_id, raw=raw)
        if replica is None:
            raise exceptions.AuthenticationFailed(
                "This replica token is not valid, or its replica has stopped."
            )
        return None, replica

    def authenticate_header(self, request: Request) -> str:
        return "Bearer"


class HasReplicaToken(permissions.BasePermission):
    def has_permission(self, request, view) -> bool:
        return isinstance(request.auth, Replica)


class ReplicaView(ValidatingView):
    authentication_classes = [ReplicaTokenAuthentication]
    permission_classes = [HasReplicaToken]


class BootstrapView(ReplicaView):
    @extend_schema(
        parameters=[WorkerBootstrapView.WorkerBootstrapIn],
        responses={200: OpenApiTypes.STR},
        operation_id="replica_bootstrap",
        summary="What a replica's machine's bootstrap installs",
        description="The same manifest as a job's machine gets (`GET /v1/worker/jobs/{id}/"
        "bootstrap`): a rented machine serving a replica installs the same worker.",
    )
    def get(self, request: Request, replica_id: str) -> HttpResponse:
        return bootstrap_manifest(self, request)


class RegisterView(ReplicaView):
    @extend_schema(
        request=None, responses={200: OpenApiTypes.OBJECT}, operation_id="replica_register"
    )
    def post(self, request: Request, replica_id: str) -> Response:
        return Response(replicas.replica_spec(replica=request.auth))


class ReadyIn(serializers.Serializer):
    url = serializers.URLField(max_length=300)

    def validate_url(self, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise serializers.ValidationError("An http(s) URL.")
        return value


class ReadyView(ReplicaView):
    @extend_schema(
        request=ReadyIn,
        responses=inline_serializer("ReplicaReady", {"status": serializers.CharField()}),
        operation_id="replica_ready",
    )
    def post(self, request: Request, replica_id: str) -> Response:
        data = self.validated(ReadyIn, request.data)
        replica = replicas.mark_ready(replica=request.auth, url=data["url"])
        return Response({"status": replica.status})


class HeartbeatView(ReplicaView):
    @extend_schema(request=None, responses=OK, operation_id="replica_heartbeat")
    def post(self, request: Request, replica_id: str) -> Response:
        replicas.heartbeat(replica=request.auth)
        return Response({"ok": True})


class FailedIn(serializers.Serializer):
    code = serializers.CharField(max_length=60)
    message = serializers.CharField(max_length=10_000, allow_blank=True, trim_whitespace=False)


class FailedView(ReplicaView):
    @extend_schema(request=FailedIn, responses=OK, operation_id="replica_failed")
    def post(self, request: Request, replica_id: str) -> Response:
        data = self.validated(FailedIn, request.data)
        replicas.report_failure(replica=request.auth, code=data["code"], message=data["message"])
        return Response({"ok": True})
