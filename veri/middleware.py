"""Guards in front of every `/v1` view, answering in the API's error format."""

from django.conf import settings
from django.core.exceptions import RequestDataTooBig, SuspiciousOperation
from django.db import InterfaceError, OperationalError, connection
from django.http import HttpRequest, JsonResponse

from veri.errors import DatabaseUnavailable, TooLarge, VeriError

# Signed local-store URLs carry file bytes of any size (they are streamed to disk, not parsed).
UNLIMITED_PREFIXES = ("/v1/store/",)


def _too_large(limit: int) -> JsonResponse:
    error = TooLarge(
        f"The request body is larger than this endpoint takes ({limit} bytes). Send fewer items "
        "per request; files go to a volume through upload URLs.",
        code="request_too_large",
    )
    return JsonResponse(error.as_body(), status=413)


class ApiGuardMiddleware:
    """A body over the limit is 413 `request_too_large` before a byte of it is read; a NUL in the
    path or query is 400 (no database column can hold one); errors Django raises while reading a
    body (too big, too many fields) and a lost database are JSON, not an HTML page."""

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
            return None
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
