"""Base of `/v1` views: validation, API-key auth and workspace, pagination, idempotency."""

import base64
import binascii
import hashlib
import json
from datetime import datetime

from django.core.exceptions import EmptyResultSet
from django.db import transaction
from django.db.models import DateTimeField, QuerySet
from drf_spectacular.utils import OpenApiParameter, extend_schema, inline_serializer
from rest_framework import permissions, serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from veri import idempotency, sealing
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


class _WorkUndone(Exception):
    """Rolls back a keyed request's work that ended without an answer to keep."""

    def __init__(self, response):
        self.response = response


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
        """DRF's dispatch, with one difference: after `initial` has claimed an idempotency key,
        the work runs in `_keyed_work`'s transaction."""
        self.args, self.kwargs = args, kwargs
        request = self.initialize_request(request, *args, **kwargs)
        self.request, self.headers = request, self.default_response_headers
        try:
            self.initial(request, *args, **kwargs)
        except Exception as exc:
            response = self.finalize_response(request, self.handle_exception(exc), *args, **kwargs)
        else:
            if self.claim is None:
                response = self._work(request, *args, **kwargs)
            else:
                response = self._keyed_work(request, *args, **kwargs)
        self.response = response
        return response

    def _work(self, request, *args, **kwargs):
        """The handler's answer, or its exception's, finalized (as in DRF's dispatch)."""
        method = request.method.lower()
        if method in self.http_method_names:
            handler = getattr(self, method, self.http_method_not_allowed)
        else:
            handler = self.http_method_not_allowed
        try:
            response = handler(request, *args, **kwargs)
        except Exception as exc:
            response = self.handle_exception(exc)
        return self.finalize_response(request, response, *args, **kwargs)

    def _keyed_work(self, request, *args, **kwargs):
        """The work and its recorded answer commit together: a request dying between them must
        not leave the work done and the key open for a retry to do it again. Without an answer
        to keep (a crash, or a 5xx) the work is rolled back and the key released, so that a
        retry does the work."""
        claim, self.claim = self.claim, None
        try:
            with transaction.atomic():
                response = self._work(request, *args, **kwargs)
                if response.status_code >= 500 or not isinstance(response, Response):
                    raise _WorkUndone(response)
                idempotency.record_answer(
                    record=claim, status_code=response.status_code, body=response.data
                )
        except _WorkUndone as undone:
            idempotency.release(record=claim)
            return undone.response
        except BaseException:
            idempotency.release(record=claim)
            raise
        return response

    def handle_exception(self, exc: Exception) -> Response:
        if isinstance(exc, _Replay):
            return Response(exc.record.body, status=exc.record.status_code)
        return super().handle_exception(exc)

    def request_fingerprint(self) -> str:
        """The request's path and body; an uploaded file counts by its content, not its name."""
        data = self.request.data
        if hasattr(data, "lists"):  # a form: every value of a repeated field counts
            body = dict(data.lists())
        elif isinstance(data, dict):
            body = dict(data)
        else:  # a list, a string, a number: a body like any other
            body = {"": data}
        for name, upload in self.request.FILES.items():
            digest = hashlib.sha256()
            for chunk in upload.chunks():
                digest.update(chunk)
            upload.seek(0)
            body[name] = f"{upload.name}:{digest.hexdigest()}"
        return idempotency.fingerprint(self.request.path, body)


def _cursor_list(queryset: QuerySet, name: str) -> str:
    """Which list a cursor belongs to: its rows' model and order, and the list's own filter (the
    workspace, the volume or job it lists): a position means nothing in another list."""
    try:
        where = str(queryset.query)
    except EmptyResultSet:
        where = ""
    scope = hashlib.sha256(where.encode()).hexdigest()[:16]
    return f"{queryset.model._meta.label_lower}.{name}.{scope}"


def _encode_cursor(list_name: str, value) -> str:
    """The position after a page, sealed with AES-GCM: encrypted (a row's id would tell how
    many rows all workspaces made meanwhile) and authenticated (a cursor we did not give out is
    refused)."""
    if isinstance(value, datetime):
        value = value.isoformat()
    sealed = sealing.seal(json.dumps([list_name, value]).encode(), purpose="cursor")
    return base64.urlsafe_b64encode(sealed).decode().rstrip("=")


def _open_cursor(cursor: str) -> bytes:
    raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
    return sealing.unseal(raw, purpose="cursor")


def _decode_cursor(cursor: str, list_name: str, field) -> object:
    """The position a cursor we gave out for this list stands for; anything else is refused."""
    invalid = VeriError(
        "This cursor is not one we gave out.", field="cursor", code="invalid_cursor"
    )
    if len(cursor) > MAX_CURSOR_CHARS:
        raise invalid
    try:
        given_for, value = json.loads(_open_cursor(cursor))
    except (ValueError, TypeError, binascii.Error, RecursionError):
        raise invalid from None
    if given_for != list_name:
        raise invalid
    # Sealed by us for this list, so it is the value we wrote: only a time needs turning back.
    return datetime.fromisoformat(value) if isinstance(field, DateTimeField) else value


def query_int(request: Request, name: str, default: int, *, low: int, high: int) -> int:
    """A whole number from the query string, written in plain ASCII digits (Python's int() also
    takes spaces, signs, underscores and other scripts' digits)."""
    raw = request.query_params.get(name)
    if raw is None:
        return default
    digits = raw.removeprefix("-")
    if not (
        digits.isascii() and digits.isdigit() and len(digits) <= 19 and low <= int(raw) <= high
    ):
        raise VeriError(f"{name} must be a whole number from {low} to {high}.", field=name)
    return int(raw)


def paginate(
    request: Request, queryset: QuerySet, serializer_class, *, order_by: str = "-pk"
) -> Response:
    """`?limit=&cursor=` over a unique field: `{"data": [...], "next_cursor": str | None}`."""
    limit = query_int(request, "limit", DEFAULT_LIMIT, low=1, high=MAX_LIMIT)
    name = order_by.lstrip("-")
    list_name = _cursor_list(queryset, name)
    if cursor := request.query_params.get("cursor"):
        field = queryset.model._meta.pk if name == "pk" else queryset.model._meta.get_field(name)
        after = _decode_cursor(cursor, list_name, field)
        queryset = queryset.filter(
            **{f"{name}__{'lt' if order_by.startswith('-') else 'gt'}": after}
        )
    rows = list(queryset.order_by(order_by)[: limit + 1])
    next_cursor = (
        _encode_cursor(list_name, getattr(rows[limit - 1], name)) if len(rows) > limit else None
    )
    data = serializer_class(rows[:limit], many=True, context={"request": request}).data
    return Response({"data": data, "next_cursor": next_cursor})
