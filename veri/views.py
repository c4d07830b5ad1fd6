"""`/v1/secrets`: a workspace's secrets, set and deleted by name; values go in, never out."""

from drf_spectacular.utils import OpenApiExample, extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from veri import selectors, services
from veri.api import WorkspaceView
from veri.models import WorkspaceSecret


class SecretOut(serializers.ModelSerializer):
    class Meta:
        model = WorkspaceSecret
        fields = ["name", "created_at", "updated_at"]


class SecretsView(WorkspaceView):
    @extend_schema(
        responses={200: inline_serializer("SecretList", {"data": SecretOut(many=True)})},
        operation_id="secrets_list",
    )
    def get(self, request: Request) -> Response:
        secrets = selectors.list_secrets(workspace=self.workspace).order_by("name")
        return Response({"data": SecretOut(secrets, many=True).data})


class SecretView(WorkspaceView):
    class SecretIn(serializers.Serializer):
        value = serializers.CharField(trim_whitespace=False, max_length=services.MAX_SECRET_CHARS)

    @extend_schema(
        request=SecretIn,
        responses={200: SecretOut, 201: SecretOut},
        examples=[OpenApiExample("A W&B key", {"value": "<your W&B API key>"}, request_only=True)],
    )
    def put(self, request: Request, name: str) -> Response:
        data = self.validated(self.SecretIn, request.data)
        secret, created = services.set_secret(
            workspace=self.workspace, name=name, value=data["value"]
        )
        return Response(SecretOut(secret).data, status=201 if created else 200)

    @extend_schema(responses={204: None})
    def delete(self, request: Request, name: str) -> Response:
        services.delete_secret(workspace=self.workspace, name=name)
        return Response(status=204)
