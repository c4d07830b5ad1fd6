"""`/v1/worker/tinker_models/{model_id}/…`: a model's worker, with its model token (good for its
own model only, dead once the model ends). The worker pulls: nothing reaches into its machine.
What it sends is hostile input."""

from django.conf import settings
from django.http import HttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import authentication, exceptions, permissions, serializers
from rest_framework.request import Request
from rest_framework.response import Response

from tinker_api import wire
from tinker_api.models import OpKind, TinkerModel, TinkerOperation
from tinker_api.services import checkpoints, workers
from training.worker_api import WorkerBootstrapView, bearer_token, bootstrap_manifest
from veri.api import ValidatingView
from veri.errors import VeriError

MAX_WAIT_SECONDS = 30.0


class SavedFile(serializers.Serializer):
    path = serializers.CharField(max_length=200)
    size = serializers.IntegerField(min_value=0)


class ModelTokenAuthentication(authentication.BaseAuthentication):
    def authenticate(self, request: Request):
        raw = bearer_token(request)
        if raw is None:
            return None
        model_id = request.parser_context["kwargs"].get("model_id", "")
        model = workers.authenticate(model_id=model_id, raw=raw)
        if model is None:
            raise exceptions.AuthenticationFailed(
                "This model token is not valid, or its model has ended."
            )
        return None, model

    def authenticate_header(self, request: Request) -> str:
        return "Bearer"


class HasModelToken(permissions.BasePermission):
    def has_permission(self, request, view) -> bool:
        return isinstance(request.auth, TinkerModel)


OK = inline_serializer("TinkerWorkerOk", {"ok": serializers.BooleanField()})


class ModelWorkerView(ValidatingView):
    authentication_classes = [ModelTokenAuthentication]
    permission_classes = [HasModelToken]


class BootstrapView(ModelWorkerView):
    @extend_schema(
        parameters=[WorkerBootstrapView.WorkerBootstrapIn],
        responses={200: OpenApiTypes.STR},
        operation_id="tinker_worker_bootstrap",
        summary="What a Tinker model's machine's bootstrap installs",
        description="The same manifest as a job's machine gets (`GET /v1/worker/jobs/{id}/"
        "bootstrap`): a rented machine holding a Tinker model installs the same worker.",
    )
    def get(self, request: Request, model_id: str) -> HttpResponse:
        return bootstrap_manifest(self, request)


class RegisterView(ModelWorkerView):
    @extend_schema(
        request=None, responses={200: OpenApiTypes.OBJECT}, operation_id="tinker_worker_register"
    )
    def post(self, request: Request, model_id: str) -> Response:
        return Response(workers.spec(model=request.auth))


class TinkerNextIn(serializers.Serializer):
    after = serializers.IntegerField(min_value=-1)
    wait = serializers.FloatField(min_value=0, max_value=MAX_WAIT_SECONDS, default=10.0)


class NextView(ModelWorkerView):
    @extend_schema(
        request=TinkerNextIn,
        responses={200: OpenApiTypes.OBJECT},
        operation_id="tinker_worker_next",
    )
    def post(self, request: Request, model_id: str) -> Response:
        data = self.validated(TinkerNextIn, request.data)
        wait = min(data["wait"], settings.VERI_TINKER_WAIT_SECONDS)
        operation = workers.next_operation(model=request.auth, after=data["after"], wait=wait)
        if operation is None:
            return Response({"operation": None})
        return Response(
            {
                "operation": {
                    "request_id": operation.request_id,
                    "seq_id": operation.seq_id,
                    "kind": operation.kind,
                    "payload": operation.payload,
                }
            }
        )


class TinkerResultIn(serializers.Serializer):
    ok = serializers.BooleanField()
    result = serializers.DictField(required=False, allow_null=True)
    error = serializers.CharField(required=False, allow_blank=True, max_length=20_000)


class ResultView(ModelWorkerView):
    @extend_schema(request=TinkerResultIn, responses={200: OK}, operation_id="tinker_worker_result")
    def post(self, request: Request, model_id: str, request_id: str) -> Response:
        data = self.validated(TinkerResultIn, request.data)
        result = data.get("result") if data["ok"] else None
        operation = (
            request.auth.operations.filter(request_id=request_id).only("kind", "payload").first()
        )
        if data["ok"] and operation is not None:
            _check_result(operation, result)
        workers.finish_operation(
            model=request.auth,
            request_id=request_id,
            ok=data["ok"],
            result=result,
            error=data.get("error", ""),
        )
        return Response({"ok": True})


def _check_result(operation: TinkerOperation, result: dict | None) -> None:
    """A result the client can read: forward outputs that encode, numeric metrics, a save's
    files (a named sampler save uploads its adapter too)."""
    kind, uploaded = operation.kind, operation.uploads
    if kind in (OpKind.CREATE, OpKind.LOAD_WEIGHTS, OpKind.SAVE_FOR_SAMPLER) and not uploaded:
        return
    if not isinstance(result, dict):
        raise VeriError("A result is an object.", field="result")
    if uploaded:
        files = SavedFile(data=result.get("files"), many=True)
        if not files.is_valid() or not 0 < len(files.validated_data) <= checkpoints.MAX_FILES:
            raise VeriError("A save's result lists its files: [{path, size}].", field="result")
        return
    metrics = result.get("metrics") or {}
    if not isinstance(metrics, dict) or not all(
        isinstance(k, str) and isinstance(v, int | float) for k, v in metrics.items()
    ):
        raise VeriError("metrics maps names to numbers.", field="result")
    if kind == OpKind.SAMPLE:
        try:
            wire.encode_sample_response(result)
        except (KeyError, TypeError, ValueError, OverflowError) as exc:
            raise VeriError(f"The samples do not encode: {exc}", field="result") from exc
        return
    if kind in (OpKind.FORWARD, OpKind.FORWARD_BACKWARD):
        try:
            wire.encode_forward_backward_output(result)
        except (KeyError, TypeError, ValueError, IndexError, OverflowError) as exc:
            raise VeriError(f"The forward outputs do not encode: {exc}", field="result") from exc


class TinkerUploadsIn(serializers.Serializer):
    files = SavedFile(many=True)


class UploadsView(ModelWorkerView):
    @extend_schema(
        request=TinkerUploadsIn,
        responses={200: OpenApiTypes.OBJECT},
        operation_id="tinker_worker_uploads",
    )
    def post(self, request: Request, model_id: str, request_id: str) -> Response:
        data = self.validated(TinkerUploadsIn, request.data)
        urls = checkpoints.upload_urls(
            model=request.auth, request_id=request_id, files=data["files"]
        )
        return Response({"files": urls})


class TinkerFailedIn(serializers.Serializer):
    code = serializers.CharField(max_length=64)
    message = serializers.CharField(max_length=20_000, allow_blank=True)


class FailedView(ModelWorkerView):
    @extend_schema(request=TinkerFailedIn, responses={200: OK}, operation_id="tinker_worker_failed")
    def post(self, request: Request, model_id: str) -> Response:
        data = self.validated(TinkerFailedIn, request.data)
        workers.report_failure(model=request.auth, code=data["code"], message=data["message"])
        return Response({"ok": True})
