from django.http import FileResponse, HttpRequest, HttpResponse, JsonResponse
from django.utils.decorators import method_decorator
from django.views import View
from django.views.decorators.csrf import csrf_exempt
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import (
    OpenApiExample,
    OpenApiParameter,
    extend_schema,
    extend_schema_field,
    inline_serializer,
)
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from veri.api import WorkspaceView, list_schema, paginate
from veri.errors import Forbidden, NotFound, TooLarge, VeriError
from volumes import selectors, services
from volumes.models import UsageSnapshot, Volume, VolumeFile
from volumes.stores import BadDigest, LocalStore, StoreError, get_store

BATCH_LIMIT = 500


@extend_schema_field(OpenApiTypes.STR)
class PlainString(serializers.Field):
    """A string taken as sent (no trimming, no NUL check): the service's own rule decides."""

    def to_internal_value(self, data):
        if not isinstance(data, str):
            raise serializers.ValidationError("Must be a string.")
        return data

    def to_representation(self, value):
        return value


class VolumeOut(serializers.ModelSerializer):
    id = serializers.CharField(source="public_id")

    class Meta:
        model = Volume
        fields = ["id", "name", "region", "status", "file_count", "total_bytes", "created_at"]


class FileOut(serializers.ModelSerializer):
    class Meta:
        model = VolumeFile
        fields = ["path", "size", "sha256", "uploaded_at"]


class UsageOut(serializers.ModelSerializer):
    class Meta:
        model = UsageSnapshot
        fields = ["hour", "file_count", "total_bytes", "taken_at"]


class FileIn(serializers.Serializer):
    path = PlainString()
    size = serializers.IntegerField(min_value=0)
    sha256 = serializers.CharField(required=False, allow_blank=True, default="")


class PartIn(serializers.Serializer):
    number = serializers.IntegerField(min_value=1, max_value=services.MAX_PARTS)
    etag = serializers.CharField()


class Batch(serializers.ListField):
    """1 to `BATCH_LIMIT` items of `item`; a longer list is 413 `too_many_files`, not 400."""

    def __init__(self, item: type[serializers.Serializer], **kwargs):
        self.item = item
        super().__init__(child=item(), allow_empty=False, max_length=BATCH_LIMIT, **kwargs)

    def to_internal_value(self, data):
        if isinstance(data, list) and not data:
            self.fail("empty")
        if isinstance(data, list) and len(data) > BATCH_LIMIT:
            raise TooLarge(
                f"At most {BATCH_LIMIT} items per batch; got {len(data)}.",
                field=self.field_name,
                code="too_many_files",
            )
        items = self.item(data=data, many=True)
        items.is_valid(raise_exception=True)
        return items.validated_data


class CompleteIn(serializers.Serializer):
    parts = PartIn(many=True, required=False)


class CompleteItemIn(CompleteIn):
    upload_id = serializers.CharField()


UploadInstructions = inline_serializer(
    "UploadInstructions",
    {
        "upload_id": serializers.CharField(required=False, help_text="absent when skipped"),
        "path": serializers.CharField(),
        "method": serializers.ChoiceField(
            ["single", "multipart"], required=False, help_text="absent when skipped"
        ),
        "url": serializers.URLField(required=False),
        "headers": serializers.DictField(
            child=serializers.CharField(),
            required=False,
            help_text="headers the PUT to `url` must carry (a signed checksum)",
        ),
        "part_size": serializers.IntegerField(required=False),
        "parts": inline_serializer(
            "PartUrl",
            {"number": serializers.IntegerField(), "url": serializers.URLField()},
            many=True,
            required=False,
        ),
        "skipped": serializers.BooleanField(required=False),
    },
)


def absolute_urls(request: Request, answer: dict) -> dict:
    """The local store signs paths; clients need whole URLs (S3's are already absolute)."""
    if "url" in answer:
        answer["url"] = request.build_absolute_uri(answer["url"])
    for part in answer.get("parts", []):
        part["url"] = request.build_absolute_uri(part["url"])
    return answer


class VolumeScopedView(WorkspaceView):
    def volume(self, id_or_name: str) -> Volume:
        return selectors.get_volume(workspace=self.workspace, id_or_name=id_or_name)


class VolumesView(WorkspaceView):
    class VolumesIn(serializers.Serializer):
        name = PlainString()
        region = serializers.CharField(required=False, allow_null=True)

    @list_schema(VolumeOut, name="VolumePage", operation_id="volumes_list")
    def get(self, request: Request) -> Response:
        return paginate(request, selectors.list_volumes(workspace=self.workspace), VolumeOut)

    @extend_schema(
        request=VolumesIn,
        responses={200: VolumeOut, 201: VolumeOut},
        examples=[OpenApiExample("A volume", {"name": "my-corpus"}, request_only=True)],
    )
    def post(self, request: Request) -> Response:
        data = self.validated(self.VolumesIn, request.data)
        volume, created = services.create_volume(workspace=self.workspace, **data)
        return Response(VolumeOut(volume).data, status=201 if created else 200)


class VolumeView(VolumeScopedView):
    @extend_schema(responses=VolumeOut)
    def get(self, request: Request, volume_id: str) -> Response:
        return Response(VolumeOut(self.volume(volume_id)).data)

    @extend_schema(
        parameters=[
            OpenApiParameter("confirm", str, description="the volume's name"),
            OpenApiParameter("force", bool, description="skip the name confirmation"),
        ],
        responses={204: None},
    )
    def delete(self, request: Request, volume_id: str) -> Response:
        force = request.query_params.get("force", "").lower() in {"1", "true", "yes"}
        services.delete_volume(
            volume=self.volume(volume_id), confirm=request.query_params.get("confirm"), force=force
        )
        return Response(status=204)


class VolumeFilesView(VolumeScopedView):
    @list_schema(
        FileOut,
        name="FilePage",
        operation_id="volumes_files_list",
        parameters=(OpenApiParameter("prefix", str, description="only paths starting with it"),),
    )
    def get(self, request: Request, volume_id: str) -> Response:
        files = selectors.list_files(
            volume=self.volume(volume_id), prefix=request.query_params.get("prefix", "")
        )
        return paginate(request, files, FileOut, order_by="path")

    @extend_schema(
        request=FileIn,
        responses={201: UploadInstructions},
        examples=[
            OpenApiExample(
                "One file", {"path": "data/train.jsonl", "size": 1024}, request_only=True
            )
        ],
    )
    def post(self, request: Request, volume_id: str) -> Response:
        volume = self.volume(volume_id)
        data = self.validated(FileIn, request.data)
        [answer] = services.start_uploads(volume=volume, files=[services.FileToUpload(**data)])
        return Response(absolute_urls(request, answer), status=201)


class UploadsBatchView(VolumeScopedView):
    class UploadsBatchIn(serializers.Serializer):
        files = Batch(FileIn)

    @extend_schema(
        request=UploadsBatchIn,
        responses={
            201: inline_serializer(
                "UploadBatch", {"data": serializers.ListField(child=UploadInstructions)}
            )
        },
    )
    def post(self, request: Request, volume_id: str) -> Response:
        volume = self.volume(volume_id)
        data = self.validated(self.UploadsBatchIn, request.data)
        files = [services.FileToUpload(**f) for f in data["files"]]
        answers = services.start_uploads(volume=volume, files=files)
        return Response({"data": [absolute_urls(request, a) for a in answers]}, status=201)


class UploadCompleteView(VolumeScopedView):
    @extend_schema(request=CompleteIn, responses=FileOut)
    def post(self, request: Request, volume_id: str, upload_id: str) -> Response:
        volume = self.volume(volume_id)
        upload = selectors.get_upload(volume=volume, upload_id=upload_id)
        data = self.validated(CompleteIn, request.data)
        parts = [(p["number"], p["etag"]) for p in data.get("parts", [])]
        [result] = services.complete_uploads(
            volume=volume, completions=[services.Completion(upload, parts)]
        )
        if isinstance(result, VeriError):
            raise result
        return Response(FileOut(result).data)


class UploadsCompleteBatchView(VolumeScopedView):
    class UploadsCompleteBatchIn(serializers.Serializer):
        uploads = Batch(CompleteItemIn)

    @extend_schema(
        request=UploadsCompleteBatchIn,
        responses=inline_serializer(
            "CompleteBatch",
            {
                "data": inline_serializer(
                    "CompleteResult",
                    {
                        "upload_id": serializers.CharField(),
                        "ok": serializers.BooleanField(),
                        "file": FileOut(required=False),
                        "error": serializers.DictField(required=False),
                    },
                    many=True,
                )
            },
        ),
    )
    def post(self, request: Request, volume_id: str) -> Response:
        volume = self.volume(volume_id)
        items = self.validated(self.UploadsCompleteBatchIn, request.data)["uploads"]
        uploads = selectors.get_uploads(volume=volume, upload_ids=[i["upload_id"] for i in items])
        completions, answers = [], []
        for item in items:
            if upload := uploads.get(item["upload_id"]):
                parts = [(p["number"], p["etag"]) for p in item.get("parts", [])]
                completions.append(services.Completion(upload, parts))
        results = iter(services.complete_uploads(volume=volume, completions=completions))
        for item in items:
            result = (
                next(results)
                if item["upload_id"] in uploads
                else NotFound(f"No upload {item['upload_id']!r} in volume {volume.name!r}.")
            )
            if isinstance(result, VeriError):
                answers.append(
                    {
                        "upload_id": item["upload_id"],
                        "ok": False,
                        "error": result.as_body()["error"],
                    }
                )
            else:
                answers.append(
                    {"upload_id": item["upload_id"], "ok": True, "file": FileOut(result).data}
                )
        return Response({"data": answers})


class UploadView(VolumeScopedView):
    @extend_schema(responses={204: None})
    def delete(self, request: Request, volume_id: str, upload_id: str) -> Response:
        upload = selectors.get_upload(volume=self.volume(volume_id), upload_id=upload_id)
        services.abort_upload(upload=upload)
        return Response(status=204)


class VolumeUsageView(VolumeScopedView):
    @list_schema(UsageOut, name="UsagePage", operation_id="volumes_usage_list")
    def get(self, request: Request, volume_id: str) -> Response:
        usage = selectors.list_usage(volume=self.volume(volume_id))
        return paginate(request, usage, UsageOut, order_by="-hour")


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
                    claims["key"], request, sha256=claims.get("sha256"), content_md5=content_md5
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
        try:
            stream = self.store.open(self.claims["key"])
        except StoreError as exc:
            return JsonResponse(NotFound(str(exc), code="no_such_key").as_body(), status=404)
        size = self.store.head(self.claims["key"]).size
        first, last = _byte_range(request.headers.get("Range"), size)
        if first is None:
            response = FileResponse(stream, content_type="application/octet-stream")
            response["Accept-Ranges"] = "bytes"
            return response
        stream.seek(first)
        response = HttpResponse(
            stream.read(last - first + 1), status=206, content_type="application/octet-stream"
        )
        stream.close()
        response["Content-Range"] = f"bytes {first}-{last}/{size}"
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
