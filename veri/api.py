"""Base of `/v1` customer views: API-key auth, workspace, validation, pagination, idempotency."""

import base64
import hashlib
import json

from django.db import IntegrityError, transaction
from django.db.models import QuerySet
from rest_framework import permissions, serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from veri.errors import Conflict, VeriError
from veri.models import ApiKey, IdempotencyRecord, Workspace

DEFAULT_LIMIT, MAX_LIMIT = 50, 200


class HasApiKey(permissions.BasePermission):
    def has_permission(self, request, view) -> bool:
        return isinstance(request.auth, ApiKey)


class _Replay(Exception):
    def __init__(self, record: IdempotencyRecord):
        self.record = record


class WorkspaceView(APIView):
    permission_classes = [HasApiKey]
    workspace: Workspace

    def initial(self, request: Request, *args, **kwargs) -> None:
        super().initial(request, *args, **kwargs)  # authenticates: 401 stops here
        self.workspace = request.auth.workspace
        self.idempotency_key = (
            request.headers.get("Idempotency-Key") if request.method == "POST" else None
        )
        if self.idempotency_key:
            record = IdempotencyRecord.objects.filter(
                workspace=self.workspace, key=self.idempotency_key
            ).first()
            if record is not None:
                raise _Replay(record)

    def handle_exception(self, exc: Exception) -> Response:
        if isinstance(exc, _Replay):
            if exc.record.request_fingerprint != self.request_fingerprint():
                exc = Conflict(
                    "This Idempotency-Key was already used for a different request.",
                    code="idempotency_key_reused",
                )
            else:
                self.idempotency_key = None  # nothing new to store
                return Response(exc.record.body, status=exc.record.status_code)
        return super().handle_exception(exc)

    def finalize_response(self, request, response, *args, **kwargs):
        response = super().finalize_response(request, response, *args, **kwargs)
        key = getattr(self, "idempotency_key", None)
        if key and response.status_code < 500 and isinstance(response, Response):
            try:
                with transaction.atomic():
                    IdempotencyRecord.objects.create(
                        workspace=self.workspace,
                        key=key,
                        request_fingerprint=self.request_fingerprint(),
                        status_code=response.status_code,
                        body=response.data,
                    )
            except IntegrityError:
                pass  # a concurrent twin stored the first answer
        return response

    def request_fingerprint(self) -> str:
        body = self.request.data if isinstance(self.request.data, dict) else {}
        payload = json.dumps([self.request.path, body], sort_keys=True, default=str)
        return hashlib.sha256(payload.encode()).hexdigest()

    def validated(self, serializer_class: type[serializers.Serializer], data) -> dict:
        serializer = serializer_class(data=data)
        serializer.is_valid(raise_exception=True)
        return serializer.validated_data


def _encode_cursor(value) -> str:
    return base64.urlsafe_b64encode(json.dumps(value).encode()).decode().rstrip("=")


def _decode_cursor(cursor: str):
    try:
        return json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
    except ValueError:
        raise VeriError(
            "This cursor is not one we gave out.", field="cursor", code="invalid_cursor"
        ) from None


def paginate(
    request: Request, queryset: QuerySet, serializer_class, *, order_by: str = "-pk"
) -> Response:
    """`?limit=&cursor=` over a unique field: `{"data": [...], "next_cursor": str | None}`."""
    raw_limit = request.query_params.get("limit", DEFAULT_LIMIT)
    try:
        limit = int(raw_limit)
    except ValueError:
        limit = 0
    if not 1 <= limit <= MAX_LIMIT:
        raise VeriError(f"limit must be between 1 and {MAX_LIMIT}.", field="limit")
    field = order_by.lstrip("-")
    if cursor := request.query_params.get("cursor"):
        after = _decode_cursor(cursor)
        queryset = queryset.filter(
            **{f"{field}__{'lt' if order_by.startswith('-') else 'gt'}": after}
        )
    rows = list(queryset.order_by(order_by)[: limit + 1])
    next_cursor = _encode_cursor(getattr(rows[limit - 1], field)) if len(rows) > limit else None
    data = serializer_class(rows[:limit], many=True, context={"request": request}).data
    return Response({"data": data, "next_cursor": next_cursor})
