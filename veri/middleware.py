"""Guards in front of every `/v1` view, answering in the API's error format."""

from django.conf import settings
from django.core.exceptions import RequestDataTooBig, SuspiciousOperation
from django.db import InterfaceError, OperationalError, connection
from django.http import HttpRequest, JsonResponse
from django.template.response import TemplateResponse

from veri.errors import DatabaseUnavailable, ServiceUnavailable, TooLarge, VeriError

# Signed local-store URLs carry file bytes of any size (they are streamed to disk, not parsed).
UNLIMITED_PREFIXES = ("/v1/store/",)


def _too_large(limit: int) -> JsonResponse:
    error = TooLarge(
        f"The request body is larger than this endpoint takes ({limit} bytes). Send fewer items "
        "per request; files go to a volume through upload URLs.",
        code="request_too_large",
    )
    return JsonResponse(error.as_body(), status=413)


def _unavailable_page(request: HttpRequest, error: ServiceUnavailable) -> TemplateResponse:
    context = {"title": "Try again in a moment", "message": error.message}
    response = TemplateResponse(request, "dashboard/message.html", context, status=503)
    response["Retry-After"] = str(error.retry_after_seconds)
    return response.render()


class ApiGuardMiddleware:
    """A body over the limit is 413 `request_too_large` before a byte of it is read; a NUL in the
    path or query is 400 (no database column can hold one); errors Django raises while reading a
    body (too big, too many fields) and a lost database are JSON, not an HTML page. A dependency
    that is away (`ServiceUnavailable`: the store, a provider) is 503 with `Retry-After`, in JSON
    under `/v1/` and as a page elsewhere."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request: HttpRequest):
        if request.path.startswith("/v1/") and not request.path.startswith(UNLIMITED_PREFIXES):
            limit = self._limit(request)
            try:
                length = int(request.META.get("CONTENT_LENGTH") or 0)
            except ValueError:
                length = 0
            if length > limit:
                return _too_large(limit)
            if "\x00" in request.path or "%00" in request.META.get("QUERY_STRING", ""):
                error = VeriError("The URL holds a NUL character.", code="invalid_request")
                return JsonResponse(error.as_body(), status=400)
        return self.get_response(request)

    @staticmethod
    def _limit(request: HttpRequest) -> int:
        if request.content_type == "multipart/form-data":
            return settings.VERI_DATASET_MAX_BYTES + settings.VERI_MAX_JSON_BYTES
        return settings.VERI_MAX_JSON_BYTES

    def process_exception(self, request: HttpRequest, exception: Exception):
        if not request.path.startswith("/v1/"):
            if isinstance(exception, ServiceUnavailable):  # a dashboard or admin page
                return _unavailable_page(request, exception)
            return None
        if isinstance(exception, ServiceUnavailable):  # outside DRF's views (the local store's)
            return exception.as_response()
        if isinstance(exception, RequestDataTooBig):
            return _too_large(settings.DATA_UPLOAD_MAX_MEMORY_SIZE)
        if isinstance(exception, OperationalError | InterfaceError):  # outside DRF's views
            return DatabaseUnavailable().as_response()
        if isinstance(exception, SuspiciousOperation):
            error = VeriError(f"The request was refused: {exception}", code="invalid_request")
            return JsonResponse(error.as_body(), status=400)
        return None


class QueryCountMiddleware:
    """With VERI_QUERY_COUNT_HEADER on, each response says how many database queries it took
    (`Veri-Db-Queries`): what bench/control_plane.py reports per endpoint, and a quick look for
    an operator at a request that grows with the data."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request: HttpRequest):
        if not settings.VERI_QUERY_COUNT_HEADER:
            return self.get_response(request)
        count = 0

        def counted(execute, sql, params, many, context):
            nonlocal count
            count += 1
            return execute(sql, params, many, context)

        with connection.execute_wrapper(counted):
            response = self.get_response(request)
        response["Veri-Db-Queries"] = str(count)
        return response
