"""`/v1/tinker/keys`: Tinker keys of the workspace, issued and revoked with a Veri API key (the
dashboard and `veri tinker key` call these)."""

from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from tinker_api import selectors
from tinker_api.services import keys
from veri.api import WorkspaceView


class KeyOut(serializers.Serializer):
    id = serializers.CharField(source="public_id")
    name = serializers.CharField()
    prefix = serializers.SerializerMethodField()
    created_at = serializers.DateTimeField()
    last_used_at = serializers.DateTimeField(allow_null=True)
    revoked_at = serializers.DateTimeField(allow_null=True)

    def get_prefix(self, key) -> str:
        return f"{keys.KEY_PREFIX}{key.prefix}"


class CreatedKeyOut(KeyOut):
    key = serializers.CharField(help_text="The key itself, shown this once.")


class TinkerKeyIn(serializers.Serializer):
    name = serializers.CharField(max_length=100, allow_blank=True, default="")


class TinkerKeysView(WorkspaceView):
    @extend_schema(
        responses={200: inline_serializer("TinkerKeyList", {"data": KeyOut(many=True)})},
        operation_id="tinker_keys_list",
    )
    def get(self, request: Request) -> Response:
        rows = selectors.list_keys(workspace=self.workspace)
        return Response({"data": KeyOut(rows, many=True).data})

    @extend_schema(
        request=TinkerKeyIn, responses={201: CreatedKeyOut}, operation_id="tinker_keys_create"
    )
    def post(self, request: Request) -> Response:
        data = self.validated(TinkerKeyIn, request.data)
        key, raw = keys.create_key(workspace=self.workspace, name=data["name"])
        return Response(KeyOut(key).data | {"key": raw}, status=201)


class TinkerKeyView(WorkspaceView):
    @extend_schema(responses={200: KeyOut}, operation_id="tinker_keys_revoke")
    def delete(self, request: Request, key_id: str) -> Response:
        key = selectors.get_key(workspace=self.workspace, key_id=key_id)
        keys.revoke_key(key=key)
        key.refresh_from_db()
        return Response(KeyOut(key).data)
