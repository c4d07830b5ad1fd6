"""The HTTP side of `LocalStore`: its signed URLs are served by the control plane itself (an S3
store's point at S3). The signature, not an API key, authorizes each request."""

from django.http import FileResponse, HttpRequest, HttpResponse, JsonResponse
from django.utils.decorators import method_decorator
from django.views import View
from django.views.decorators.csrf import csrf_exempt

from veri.errors import Forbidden, NotFound, VeriError
from volumes.stores import get_store
from volumes.stores.base import BadDigest, ObjectExists, StoreError
from volumes.stores.local import LocalStore


@method_decorator(csrf_exempt, name="dispatch")  # the URL's signature is the credential
class LocalStoreView(View):
    """Serves `LocalStore`'s signed URLs: the signature, not an API key, authorizes the request."""

    http_method_names = ["get", "put", "head"]

    def dispatch(self, request: HttpRequest, token: str) -> HttpResponse:
        store = get_store()
        if not isinstance(store, LocalStore):
            return JsonResponse(
                NotFound("This deployment has no local store.").as_body(), status=404
            )
        try:
            self.claims = store.verify(token)
        except StoreError as exc:
            error = Forbidden(f"This URL is not valid ({exc}).", code=str(exc))
            return JsonResponse(error.as_body(), status=403)
        self.store = store
        return super().dispatch(request)

    def http_method_not_allowed(self, request: HttpRequest, *args, **kwargs) -> HttpResponse:
        error = VeriError(
            f"{request.method} is not allowed on a store URL.", code="method_not_allowed"
        )
        response = JsonResponse(error.as_body(), status=405)
        response["Allow"] = ", ".join(m.upper() for m in self.http_method_names)
        return response

    def put(self, request: HttpRequest) -> HttpResponse:
        if not request.META.get("CONTENT_LENGTH"):  # a chunked body would arrive cut (S3: 411)
            error = VeriError("Send the body with a Content-Length.", code="length_required")
            return JsonResponse(error.as_body(), status=411)
        claims, content_md5 = self.claims, request.headers.get("Content-MD5")
        try:
            if claims["op"] == "put":
                etag = self.store.write(
                    claims["key"],
                    request,
                    sha256=claims.get("sha256"),
                    content_md5=content_md5,
                    create_only=claims.get("create_only", False),
                )
            elif claims["op"] == "part":
                etag = self.store.write_part(
                    claims["key"],
                    upload_id=claims["upload_id"],
                    number=claims["number"],
                    stream=request,
                    content_md5=content_md5,
                )
            else:
                error = Forbidden("This URL does not allow uploads.")
                return JsonResponse(error.as_body(), status=403)
        except BadDigest as exc:
            return JsonResponse(VeriError(str(exc), code="bad_digest").as_body(), status=400)
        except ObjectExists:  # S3 answers 412 PreconditionFailed to its If-None-Match: *
            error = VeriError(
                "This URL's object is already stored, and a stored file is never rewritten; "
                "start a new upload to replace it.",
                code="precondition_failed",
            )
            return JsonResponse(error.as_body(), status=412)
        except StoreError as exc:
            return JsonResponse(NotFound(str(exc), code="no_such_upload").as_body(), status=404)
        except OSError as exc:  # the disk refused the write: like an S3 5xx, worth a retry
            error = VeriError(
                f"The store could not write: {exc.strerror}.", code="store_unavailable"
            )
            return JsonResponse(error.as_body(), status=503)
        response = HttpResponse(status=200)
        response["ETag"] = f'"{etag}"'
        return response

    def get(self, request: HttpRequest) -> HttpResponse:
        if self.claims["op"] != "get":
            return JsonResponse(
                Forbidden("This URL does not allow downloads.").as_body(), status=403
            )
        key = self.claims["key"]
        found = self.store.head(key)
        first, last = _byte_range(request.headers.get("Range"), found.size if found else 0)
        try:
            stream = self.store.open(key, byte_range=None if first is None else (first, last))
        except StoreError as exc:
            return JsonResponse(NotFound(str(exc), code="no_such_key").as_body(), status=404)
        if first is None:
            response = FileResponse(stream, content_type="application/octet-stream")
            response["Accept-Ranges"] = "bytes"
            return response
        with stream:
            response = HttpResponse(
                stream.read(), status=206, content_type="application/octet-stream"
            )
        response["Content-Range"] = f"bytes {first}-{last}/{found.size}"
        return response


def _byte_range(header: str | None, size: int) -> tuple[int | None, int | None]:
    """One `bytes=a-b` range, as S3 takes it; anything else means the whole object."""
    if not header or not header.startswith("bytes=") or "," in header:
        return None, None
    start, _, end = header[len("bytes=") :].partition("-")
    try:
        if not start:
            first, last = max(size - int(end), 0), size - 1
        else:
            first, last = int(start), min(int(end) if end else size - 1, size - 1)
    except ValueError:
        return None, None
    return (first, last) if first <= last else (None, None)
