"""The one `/v1` error format: `{"error": {"code", "message", "field", ...}}`."""

from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import InterfaceError, OperationalError
from django.http import Http404, HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from rest_framework import exceptions
from rest_framework.response import Response


class VeriError(Exception):
    status, code = 400, "invalid_request"

    def __init__(self, message: str, *, field: str | None = None, code: str | None = None, **extra):
        super().__init__(message)
        self.message, self.field, self.extra = message, field, extra
        if code:
            self.code = code

    def as_body(self) -> dict:
        return {
            "error": {"code": self.code, "message": self.message, "field": self.field, **self.extra}
        }


class NotFound(VeriError):
    status, code = 404, "not_found"


class Conflict(VeriError):
    status, code = 409, "conflict"


class TooLarge(VeriError):
    status, code = 413, "too_large"


class PaymentRequired(VeriError):
    status, code = 402, "billing_account_required"


class TooManyRequests(VeriError):
    """Over a rate limit: 429, with `headers` saying what is left and when to retry."""

    status, code = 429, "rate_limit_exceeded"

    def __init__(self, message: str, *, headers: dict[str, str], **extra):
        super().__init__(message, **extra)
        self.headers = headers


class Forbidden(VeriError):
    status, code = 403, "forbidden"


class ServiceUnavailable(VeriError):
    """Something the request needed (the database, the object store, a GPU provider's API) could
    not be reached, or answered with its own server error: nothing the client can fix, and the
    same request may well succeed later. Answered 503 with `Retry-After` (the SDK waits that
    long and retries), never a 500."""

    status, code = 503, "service_unavailable"
    retry_after_seconds = 5

    def as_response(self) -> JsonResponse:
        response = JsonResponse(self.as_body(), status=self.status)
        response["Retry-After"] = str(self.retry_after_seconds)
        return response


class DatabaseUnavailable(ServiceUnavailable):
    """The database dropped or refused the connection: nothing was done that the client can
    see, and the same request can be sent again (the SDK does, after `Retry-After`)."""

    code = "database_unavailable"
    retry_after_seconds = 2

    def __init__(self):
        super().__init__(
            "The database is unreachable for a moment; nothing was changed. Retry the request."
        )


def first_error(detail, path: str = "") -> tuple[str | None, str]:
    """The first (field path, message) in DRF's nested error detail, e.g. `files.3.path`."""
    if isinstance(detail, dict):
        key, value = next(iter(detail.items()))
        field = None if key in {"non_field_errors", "__all__"} else str(key)
        return first_error(value, f"{path}.{field}" if path and field else (field or path))
    if isinstance(detail, list) and detail:
        for index, item in enumerate(detail):
            if item:  # list serializers report {} for the rows without errors
                nested = isinstance(item, dict | list)
                return first_error(item, f"{path}.{index}" if nested and path else path)
    return (path or None), str(detail)


def exception_handler(exc, context):
    if isinstance(exc, Http404):
        exc = NotFound("Not found.")
    if isinstance(exc, DjangoValidationError):
        exc = exceptions.ValidationError(
            exc.message_dict if hasattr(exc, "error_dict") else exc.messages
        )
    if isinstance(exc, exceptions.ValidationError):
        field, message = first_error(exc.detail)
        label = f"{field}: " if field else ""
        exc = VeriError(f"{label}{message}", field=field)
    if isinstance(exc, exceptions.ParseError):
        exc = VeriError(str(exc.detail), code="parse_error")
    if isinstance(exc, OperationalError | InterfaceError):
        return DatabaseUnavailable().as_response()
    if isinstance(exc, VeriError):
        response = Response(exc.as_body(), status=exc.status)
        if isinstance(exc, ServiceUnavailable):
            response["Retry-After"] = str(exc.retry_after_seconds)
        if isinstance(exc, TooManyRequests):
            for name, value in exc.headers.items():
                response[name] = value
        return response
    # Imported here: DRF's views module reads the authentication settings as it loads, and those
    # import this module (through the stores' KeyRefused, an error of ours).
    from rest_framework.views import exception_handler as drf_exception_handler

    response = drf_exception_handler(exc, context)  # 401/405/415/429, keeps Retry-After
    if response is not None:
        code = exc.get_codes() if isinstance(exc.get_codes(), str) else exc.default_code
        response.data = {"error": {"code": code, "message": str(exc.detail), "field": None}}
    return response  # None: a bug; it 500s (as JSON, see server_error) and reaches the logs


@csrf_exempt  # unknown routes answer 404 in JSON for every method, not Django's CSRF page
def not_found(request: HttpRequest, exception: Exception | None = None) -> JsonResponse:
    return JsonResponse(NotFound(f"No route {request.path}.").as_body(), status=404)


def server_error(request: HttpRequest) -> JsonResponse:
    body = VeriError("Internal error; it has been logged.", code="internal_error").as_body()
    return JsonResponse(body, status=500)
