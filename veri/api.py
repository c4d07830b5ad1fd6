"""Base of `/v1` views: validation, API-key auth and workspace, pagination, idempotency."""

import base64
import binascii
import hashlib
import json
from datetime import UTC, datetime

from django.db.models import DateTimeField, IntegerField, QuerySet
from drf_spectacular.utils import OpenApiParameter, extend_schema, inline_serializer
from rest_framework import permissions, serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from veri import idempotency
from veri.errors import VeriError
from veri.models import ApiKey, Workspace

DEFAULT_LIMIT, MAX_LIMIT = 50, 200
MAX_CURSOR_CHARS = 1000


def list_schema(
    serializer_class: type[serializers.Serializer],
    *,
    name: str,
    operation_id: str,
    parameters: tuple[OpenApiParameter, ...] = (),
):
    """The schema of a paginated list: `?limit=&cursor=`, answering one page
    `{"data": [...], "next_cursor": str | null}`."""
    page = inline_serializer(
        name,
        {
            "data": serializer_class(many=True),
            "next_cursor": serializers.CharField(allow_null=True),
        },
    )
    return extend_schema(
        operation_id=operation_id,
        parameters=[
            OpenApiParameter(
                "limit", int, description=f"1 to {MAX_LIMIT} (default {DEFAULT_LIMIT})"
            ),
            OpenApiParameter("cursor", str, description="`next_cursor` of the previous page"),
            *parameters,
        ],
        responses=page,
    )


class ValidatingView(APIView):
    def validated(self, serializer_class: type[serializers.Serializer], data) -> dict:
        serializer = serializer_class(data=data)
        serializer.is_valid(raise_exception=True)
        return serializer.validated_data


class HasApiKey(permissions.BasePermission):
    def has_permission(self, request, view) -> bool:
        return isinstance(request.auth, ApiKey)


class _Replay(Exception):
    def __init__(self, record):
        self.record = record


class WorkspaceView(ValidatingView):
    """A customer view: `self.workspace` from the API key. A POST with an `Idempotency-Key`
    claims the key before any work (see `veri.idempotency`): a retry gets the first answer, a
    concurrent twin waits for it, and the work is never done twice."""

    permission_classes = [HasApiKey]
    workspace: Workspace
    claim = None

    def initial(self, request: Request, *args, **kwargs) -> None:
        super().initial(request, *args, **kwargs)  # authenticates: 401 stops here
        self.workspace = request.auth.workspace
        key = request.headers.get("Idempotency-Key") if request.method == "POST" else None
        if key is not None:
            outcome = idempotency.claim(
                workspace=self.workspace, key=key, fingerprint=self.request_fingerprint()
            )
            if outcome.replay:
                raise _Replay(outcome.record)
            self.claim = outcome.record

    def dispatch(self, request, *args, **kwargs):
        try:
            return super().dispatch(request, *args, **kwargs)
        finally:
            if self.claim is not None:  # the work crashed before an answer: a retry redoes it
                idempotency.release(record=self.claim)

    def handle_exception(self, exc: Exception) -> Response:
        if isinstance(exc, _Replay):
            return Response(exc.record.body, status=exc.record.status_code)
        return super().handle_exception(exc)

    def finalize_response(self, request, response, *args, **kwargs):
        response = super().finalize_response(request, response, *args, **kwargs)
        if self.claim is not None:
            if response.status_code < 500 and isinstance(response, Response):
                idempotency.record_answer(
                    record=self.claim, status_code=response.status_code, body=response.data
                )
            else:
                idempotency.release(record=self.claim)
            self.claim = None
        return response

    def request_fingerprint(self) -> str:
        """The request's path and body; an uploaded file counts by its content, not its name."""
        data = self.request.data
        body = dict(data.items()) if hasattr(data, "items") else {}
        for name, upload in self.request.FILES.items():
            digest = hashlib.sha256()
            for chunk in upload.chunks():
                digest.update(chunk)
            upload.seek(0)
            body[name] = f"{upload.name}:{digest.hexdigest()}"
        return idempotency.fingerprint(self.request.path, body)


def _encode_cursor(value) -> str:
    if isinstance(value, datetime):
        value = value.isoformat()
    return base64.urlsafe_b64encode(json.dumps(value).encode()).decode().rstrip("=")


def _decode_cursor(cursor: str, field) -> object:
    """The position a cursor we gave out stands for, of the type of the field it orders by;
    anything else (an object, a list, a number past 64 bits, a string too long) is refused."""
    invalid = VeriError(
        "This cursor is not one we gave out.", field="cursor", code="invalid_cursor"
    )
    if len(cursor) > MAX_CURSOR_CHARS:
        raise invalid
    try:
        value = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
    except (ValueError, binascii.Error, RecursionError):
        raise invalid from None
    if isinstance(field, IntegerField):
        if isinstance(value, bool) or not isinstance(value, int) or abs(value) >= 2**63:
            raise invalid
        return value
    if not isinstance(value, str) or "\x00" in value or not value.isprintable():
        raise invalid
    try:
        value.encode()
    except UnicodeEncodeError:  # a lone surrogate: no database takes it
        raise invalid from None
    if isinstance(field, DateTimeField):
        try:
            moment = datetime.fromisoformat(value)
            return moment.astimezone(UTC) if moment.tzinfo else moment.replace(tzinfo=UTC)
        except (ValueError, OverflowError):
            raise invalid from None
    return value


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
    name = order_by.lstrip("-")
    if cursor := request.query_params.get("cursor"):
        field = queryset.model._meta.pk if name == "pk" else queryset.model._meta.get_field(name)
        after = _decode_cursor(cursor, field)
        queryset = queryset.filter(
            **{f"{name}__{'lt' if order_by.startswith('-') else 'gt'}": after}
        )
    rows = list(queryset.order_by(order_by)[: limit + 1])
    next_cursor = _encode_cursor(getattr(rows[limit - 1], name)) if len(rows) > limit else None
    data = serializer_class(rows[:limit], many=True, context={"request": request}).data
    return Response({"data": data, "next_cursor": next_cursor})
