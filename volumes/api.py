import unicodedata

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
from veri.errors import NotFound, TooLarge, VeriError
from volumes import selectors, services
from volumes.models import UsageSnapshot, Volume, VolumeFile

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


@extend_schema_field(OpenApiTypes.STR)
class PathString(PlainString):
    """A file path, taken as sent but in its one Unicode spelling (NFC), so a decomposed `café`
    from a Mac names the same file as a composed one; the service's path rule decides the rest."""

    def to_internal_value(self, data):
        return unicodedata.normalize("NFC", super().to_internal_value(data))


class FileIn(serializers.Serializer):
    path = PathString()
    size = serializers.IntegerField(min_value=0)
    sha256 = serializers.CharField(required=False, allow_blank=True, default="")


class PartIn(serializers.Serializer):
    number = serializers.IntegerField(min_value=1, max_value=services.MAX_PARTS)
    etag = serializers.CharField()


class Batch(serializers.ListField):
    """1 to `BATCH_LIMIT` items of `item`; a longer list is 413 `too_many_files`, not 400."""

    def __init__(self, item: type[serializers.Serializer], **kwargs):
        self.item = item
        # min_length as well as allow_empty: the schema's minItems comes from min_length alone.
        super().__init__(
            child=item(), allow_empty=False, min_length=1, max_length=BATCH_LIMIT, **kwargs
        )

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
            ["single", "multipart", "packed"], required=False, help_text="absent when skipped"
        ),
        "url": serializers.URLField(required=False),
        "headers": serializers.DictField(
            child=serializers.CharField(),
            required=False,
            help_text="headers the PUT to `url` must carry, as signed (checksum, If-None-Match)",
        ),
        "part_size": serializers.IntegerField(required=False),
        "parts": inline_serializer(
            "PartUrl",
            {"number": serializers.IntegerField(), "url": serializers.URLField()},
            many=True,
            required=False,
        ),
        "pack": serializers.IntegerField(
            required=False, help_text="packed: the index of its pack in the answer's `packs`"
        ),
        "offset": serializers.IntegerField(
            required=False, help_text="packed: where its bytes start in its pack"
        ),
        "skipped": serializers.BooleanField(required=False),
    },
)
PackInstructions = inline_serializer(
    "PackInstructions",
    {
        "url": serializers.URLField(),
        "headers": serializers.DictField(
            child=serializers.CharField(), help_text="headers the PUT must carry, as signed"
        ),
        "size": serializers.IntegerField(
            help_text="the pack's bytes: its files', one after another"
        ),
    },
)


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
        volume = self.volume(volume_id)
        prefix = services.validate_prefix(request.query_params.get("prefix", ""))
        return paginate(
            request, selectors.list_files(volume=volume, prefix=prefix), FileOut, order_by="path"
        )

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
        return Response(answer, status=201)


class UploadsBatchView(VolumeScopedView):
    class UploadsBatchIn(serializers.Serializer):
        files = Batch(FileIn)
        pack = serializers.BooleanField(
            default=False,
            help_text="send the small files (up to 1 MiB, with a sha256) in packs, each one PUT",
        )

    @extend_schema(
        request=UploadsBatchIn,
        responses={
            201: inline_serializer(
                "UploadBatch",
                {
                    "data": serializers.ListField(child=UploadInstructions),
                    "packs": serializers.ListField(
                        child=PackInstructions, required=False, help_text="when `pack` was asked"
                    ),
                },
            )
        },
    )
    def post(self, request: Request, volume_id: str) -> Response:
        volume = self.volume(volume_id)
        data = self.validated(self.UploadsBatchIn, request.data)
        files = [services.FileToUpload(**f) for f in data["files"]]
        if not data["pack"]:
            return Response(
                {"data": services.start_uploads(volume=volume, files=files)}, status=201
            )
        answers, packs = services.start_packed_uploads(volume=volume, files=files)
        return Response({"data": answers, "packs": packs}, status=201)


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
        completions = []
        for item in items:
            if upload := uploads.get(item["upload_id"]):
                parts = [(p["number"], p["etag"]) for p in item.get("parts", [])]
                completions.append(services.Completion(upload, parts))
        results = iter(services.complete_uploads(volume=volume, completions=completions))
        outcomes = [
            next(results)
            if item["upload_id"] in uploads
            else NotFound(f"No upload {item['upload_id']!r} in volume {volume.name!r}.")
            for item in items
        ]
        # One serializer for the batch: a ModelSerializer builds its fields for each instance.
        files = iter(FileOut([o for o in outcomes if not isinstance(o, VeriError)], many=True).data)
        answers = [
            {"upload_id": item["upload_id"], "ok": False, "error": outcome.as_body()["error"]}
            if isinstance(outcome, VeriError)
            else {"upload_id": item["upload_id"], "ok": True, "file": next(files)}
            for item, outcome in zip(items, outcomes, strict=True)
        ]
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
