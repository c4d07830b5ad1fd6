"""`/v1/worker/jobs/{id}/…`: the worker's side, with a job token good for its own job only.

Everything a worker sends is hostile input: every body goes through a serializer with bounds
(steps fit their columns, paths pass the volume path rules, lists and texts have a size)."""

import re

from django.conf import settings
from django.http import HttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import (
    OpenApiExample,
    extend_schema,
    extend_schema_field,
    inline_serializer,
)
from rest_framework import authentication, exceptions, permissions, serializers
from rest_framework.request import Request
from rest_framework.response import Response

from providers import worker_dist
from training.models import MAX_SEQ, TrainingJob
from training.services import jobs, timings
from training.services import logs as log_services
from training.services import worker as worker_services
from veri.api import ValidatingView
from veri.errors import NotFound
from volumes.api import PathString
from volumes.services import MAX_OBJECT_BYTES

MAX_STEP = 2**31 - 1  # the step columns are 32-bit
MAX_CHECKPOINT_STEP = 10**8 - 1  # checkpoint folders are step-NNNNNNNN
MAX_LINE_CHARS = 16_384
MAX_MESSAGE_CHARS = 10_000
MAX_SAMPLE_CHARS = 2_000
METRIC_NAME_RE = re.compile(r"[A-Za-z0-9_./:-]{1,100}")
EXAMPLE_SHA256 = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"


DEAD_TOKEN = (
    "This job token is not valid (unknown, expired, or replaced by a renewal or a relaunch), or "
    "its job has finished."
)


def bearer_token(request: Request) -> str | None:
    header = authentication.get_authorization_header(request).decode("latin-1")
    scheme, _, raw = header.partition(" ")
    return raw.strip() if scheme == "Bearer" and raw.strip() else None


class JobTokenAuthentication(authentication.BaseAuthentication):
    job_for_token = staticmethod(worker_services.authenticate_job_token)

    def authenticate(self, request: Request):
        raw = bearer_token(request)
        if raw is None:
            return None
        job = self.job_for_token(raw=raw)
        if job is None:
            raise exceptions.AuthenticationFailed(DEAD_TOKEN)
        return None, job

    def authenticate_header(self, request: Request) -> str:
        return "Bearer"


class ReleaseTokenAuthentication(JobTokenAuthentication):
    """A job token that is still this run's, also once its job has ended (release only)."""

    job_for_token = staticmethod(worker_services.authenticate_release_token)


class HasJobToken(permissions.BasePermission):
    def has_permission(self, request, view) -> bool:
        return isinstance(request.auth, TrainingJob)


class WorkerView(ValidatingView):
    authentication_classes = [JobTokenAuthentication]
    permission_classes = [HasJobToken]

    def initial(self, request: Request, *args, **kwargs) -> None:
        super().initial(request, *args, **kwargs)
        if request.auth.public_id != kwargs.get("job_id"):
            raise NotFound("Not found.")  # a token opens its own job only
        self.job = request.auth


@extend_schema_field(OpenApiTypes.STR)
class LossyText(serializers.Field):
    """Text a process printed: a NUL becomes U+FFFD and text past `limit` is cut, rather than
    refusing (and so losing) a log line or an error message."""

    def __init__(self, *, limit: int, **kwargs):
        self.limit = limit
        super().__init__(**kwargs)

    def to_internal_value(self, data):
        if not isinstance(data, str):
            raise serializers.ValidationError("Must be a string.")
        return data.replace("\x00", "\ufffd")[: self.limit]

    def to_representation(self, value):
        return value


class MetricValues(serializers.DictField):
    child = serializers.FloatField(allow_null=True)

    def to_internal_value(self, data):
        values = super().to_internal_value(data)
        if len(values) > 200:
            raise serializers.ValidationError("At most 200 metrics per step.")
        for name in values:
            if not METRIC_NAME_RE.fullmatch(name):
                raise serializers.ValidationError(
                    f"Metric names are 1-100 letters, digits and _ . / : -; got {name[:100]!r}."
                )
        return values


class Ack(serializers.Serializer):
    status = serializers.CharField()


class AckAdded(Ack):
    added = serializers.IntegerField()


class StopOut(serializers.Serializer):
    code = serializers.CharField()
    message = serializers.CharField()


class HeartbeatAck(Ack):
    stop = StopOut(
        allow_null=True,
        help_text="set when the control plane asks the worker to save a checkpoint and end",
    )


def _ok(job: TrainingJob, **extra) -> Response:
    return Response({"status": job.status, **extra})


class BootstrapIn(serializers.Serializer):
    backend = serializers.CharField(max_length=20, help_text="the torch build installed")
    source = serializers.ChoiceField(
        choices=["wheelhouse", "index"], help_text="where the dependencies came from"
    )
    fetch_seconds = serializers.FloatField(min_value=0, max_value=86_400)
    python_seconds = serializers.FloatField(min_value=0, max_value=86_400)
    install_seconds = serializers.FloatField(min_value=0, max_value=86_400)


class WorkerBootstrapView(WorkerView):
    class WorkerBootstrapIn(serializers.Serializer):
        cuda = serializers.RegexField(
            r"^(\d{1,3}\.\d{1,3})?$",
            required=False,
            default="",
            help_text="the CUDA version the machine's driver supports, as `nvidia-smi` prints "
            "it; empty without a GPU",
        )

    @extend_schema(
        parameters=[WorkerBootstrapIn],
        responses={200: OpenApiTypes.STR},
        summary="What the machine's bootstrap installs",
        description="Plain text, one instruction a line: `python VERSION`, `backend NAME` (the "
        "torch build of the stored wheelhouse chosen for this driver, `none` without one), "
        "optionally `index URL` and `package SPEC` (the operator's overrides), then `file KIND "
        "SHA256 NAME URL` for the `uv` installer, the `worker` wheel of this control plane's "
        "code and each `wheel` of the wheelhouse, with URLs signed for VERI_PRESIGN_TTL_SECONDS.",
    )
    def get(self, request: Request, job_id: str) -> HttpResponse:
        return bootstrap_manifest(self, request)


def bootstrap_manifest(view: ValidatingView, request: Request) -> HttpResponse:
    """The manifest a rented machine's bootstrap installs from: the same for a job's, a
    replica's and a Tinker model's machine."""
    cuda = view.validated(WorkerBootstrapView.WorkerBootstrapIn, request.query_params)["cuda"]
    text = worker_dist.manifest(cuda=cuda, expires=settings.VERI_PRESIGN_TTL_SECONDS)
    return HttpResponse(text, content_type="text/plain; charset=utf-8")


class WorkerRegisterView(WorkerView):
    class WorkerRegisterIn(serializers.Serializer):
        hostname = serializers.CharField(required=False, allow_blank=True, max_length=255)
        python = serializers.CharField(required=False, allow_blank=True, max_length=50)
        build = serializers.CharField(
            max_length=64, help_text="the worker's build id (worker/build.py)"
        )
        bootstrap = BootstrapIn(
            required=False, help_text="how the machine's bootstrap installed the worker"
        )

    @extend_schema(request=WorkerRegisterIn, responses={200: Ack})
    def post(self, request: Request, job_id: str) -> Response:
        info = self.validated(self.WorkerRegisterIn, request.data)
        return _ok(worker_services.register(job=self.job, info=info))


class WorkerSpecView(WorkerView):
    @extend_schema(responses={200: OpenApiTypes.OBJECT})
    def get(self, request: Request, job_id: str) -> Response:
        return Response(worker_services.build_spec(job=self.job))


class WorkerStatusView(WorkerView):
    class WorkerStatusIn(serializers.Serializer):
        status = serializers.CharField(max_length=20)

    @extend_schema(
        request=WorkerStatusIn,
        responses={200: Ack},
        examples=[OpenApiExample("Training started", {"status": "running"}, request_only=True)],
    )
    def post(self, request: Request, job_id: str) -> Response:
        status = self.validated(self.WorkerStatusIn, request.data)["status"]
        return _ok(worker_services.report_status(job=self.job, status=status))


class WorkerPhaseView(WorkerView):
    class WorkerPhaseIn(serializers.Serializer):
        phase = serializers.ChoiceField(choices=["sync", "hardware", "training", "finishing"])

    @extend_schema(
        request=WorkerPhaseIn,
        responses={200: Ack},
        summary="The runner moved on to the next phase of its run",
        examples=[OpenApiExample("Customer code starts", {"phase": "training"}, request_only=True)],
    )
    def post(self, request: Request, job_id: str) -> Response:
        phase = self.validated(self.WorkerPhaseIn, request.data)["phase"]
        return _ok(worker_services.enter_phase(job=self.job, phase=phase))


class TimingAck(Ack):
    recorded = serializers.BooleanField(
        help_text="false when the report was ignored: the phase was already recorded, a later "
        "one was, or the run is not registered or has ended"
    )


class WorkerTimingsView(WorkerView):
    class WorkerTimingsIn(serializers.Serializer):
        phase = serializers.ChoiceField(choices=timings.WORKER_PHASES)
        synced_bytes = serializers.IntegerField(
            required=False, default=0, min_value=0, max_value=2**63 - 1
        )
        sync_seconds = serializers.FloatField(
            required=False, default=0.0, min_value=0, max_value=86_400 * 30
        )

    @extend_schema(
        request=WorkerTimingsIn,
        responses={200: TimingAck},
        summary="The run entered a start-up phase only the worker sees",
        description="Stamped with the control plane's clock on arrival; `synced_bytes` and "
        "`sync_seconds` (with `volumes_synced`) are clamped to the job's volumes and to the "
        "time since the worker registered. Shown in the job's `timings`, nothing else.",
        examples=[
            OpenApiExample(
                "Volumes synced",
                {"phase": "volumes_synced", "synced_bytes": 1048576, "sync_seconds": 0.8},
                request_only=True,
            )
        ],
    )
    def post(self, request: Request, job_id: str) -> Response:
        data = self.validated(self.WorkerTimingsIn, request.data)
        recorded = timings.report(job=self.job, **data)
        return _ok(self.job, recorded=recorded)


class WorkerHeartbeatView(WorkerView):
    class WorkerHeartbeatIn(serializers.Serializer):
        step = serializers.IntegerField(
            required=False, allow_null=True, min_value=0, max_value=MAX_STEP, default=None
        )

    @extend_schema(request=WorkerHeartbeatIn, responses={200: HeartbeatAck})
    def post(self, request: Request, job_id: str) -> Response:
        step = self.validated(self.WorkerHeartbeatIn, request.data)["step"]
        worker_services.heartbeat(job=self.job, step=step)
        stop = {"code": self.job.stop_code, "message": self.job.stop_message}
        return _ok(self.job, stop=stop if self.job.stop_code else None)


class WorkerNoticeView(WorkerView):
    class WorkerNoticeIn(serializers.Serializer):
        source = serializers.ChoiceField(choices=["aws", "gcp", "local"])
        terminates_at = serializers.DateTimeField(required=False, allow_null=True, default=None)

    @extend_schema(
        request=WorkerNoticeIn,
        responses={200: Ack},
        summary="The provider warned that the machine is going away",
        examples=[
            OpenApiExample(
                "AWS spot interruption",
                {"source": "aws", "terminates_at": "2026-12-03T12:02:00Z"},
                request_only=True,
            )
        ],
    )
    def post(self, request: Request, job_id: str) -> Response:
        notice = self.validated(self.WorkerNoticeIn, request.data)
        worker_services.preemption_notice(job=self.job, **notice)
        return _ok(self.job)


class TokenOut(serializers.Serializer):
    token = serializers.CharField()
    expires_at = serializers.DateTimeField()
    renew_after_seconds = serializers.IntegerField()


class WorkerTokenView(WorkerView):
    @extend_schema(
        request=None,
        responses={200: TokenOut},
        summary="Renew the job token",
        description="A fresh token for the token's whole lifetime, to use from now on; the token "
        "sent keeps working for VERI_JOB_TOKEN_OVERLAP_SECONDS, any other one of the job "
        "stops at once. Ask again after `renew_after_seconds`.",
    )
    def post(self, request: Request, job_id: str) -> Response:
        renewed = worker_services.renew_job_token(raw=bearer_token(request))
        if renewed is None:  # ended or replaced since it was authenticated
            raise exceptions.AuthenticationFailed(DEAD_TOKEN)
        return Response(TokenOut(renewed).data)


class LogLineIn(serializers.Serializer):
    seq = serializers.IntegerField(min_value=0, max_value=MAX_SEQ)
    text = LossyText(limit=MAX_LINE_CHARS)
    at = serializers.DateTimeField(required=False)


class MetricPointIn(serializers.Serializer):
    step = serializers.IntegerField(min_value=0, max_value=MAX_STEP)
    values = MetricValues()
    at = serializers.DateTimeField(required=False)


class LogsAck(AckAdded):
    log_truncated = serializers.BooleanField(
        help_text="the job's log reached VERI_MAX_LOG_BYTES: later lines are dropped, so the "
        "worker stops sending them"
    )


class WorkerLogsView(WorkerView):
    class WorkerLogsIn(serializers.Serializer):
        lines = LogLineIn(many=True, max_length=5000)

    @extend_schema(request=WorkerLogsIn, responses={200: LogsAck})
    def post(self, request: Request, job_id: str) -> Response:
        lines = self.validated(self.WorkerLogsIn, request.data)["lines"]
        added = worker_services.append_logs(job=self.job, lines=lines)
        return _ok(self.job, added=added, log_truncated=log_services.is_truncated(job=self.job))


class SampleIn(serializers.Serializer):
    step = serializers.IntegerField(min_value=0, max_value=MAX_STEP)
    index = serializers.IntegerField(min_value=0, max_value=63)
    prompt = LossyText(limit=MAX_SAMPLE_CHARS)
    completion = LossyText(limit=MAX_SAMPLE_CHARS)
    reward = serializers.FloatField()
    rewards = MetricValues(required=False, default=dict)


class WorkerSamplesView(WorkerView):
    class WorkerSamplesIn(serializers.Serializer):
        samples = SampleIn(many=True, max_length=64)

    @extend_schema(request=WorkerSamplesIn, responses={200: AckAdded})
    def post(self, request: Request, job_id: str) -> Response:
        samples = self.validated(self.WorkerSamplesIn, request.data)["samples"]
        return _ok(self.job, added=worker_services.record_samples(job=self.job, samples=samples))


class WorkerMetricsView(WorkerView):
    class WorkerMetricsIn(serializers.Serializer):
        points = MetricPointIn(many=True, max_length=5000)

    @extend_schema(request=WorkerMetricsIn, responses={200: AckAdded})
    def post(self, request: Request, job_id: str) -> Response:
        points = self.validated(self.WorkerMetricsIn, request.data)["points"]
        return _ok(self.job, added=worker_services.record_metrics(job=self.job, points=points))


class WorkerVolumeCredentialsView(WorkerView):
    @extend_schema(request=None, responses={200: OpenApiTypes.OBJECT})
    def post(self, request: Request, job_id: str) -> Response:
        return Response(worker_services.volume_credentials(job=self.job))


OutputUrls = inline_serializer(
    "OutputUrl",
    {
        "path": serializers.CharField(),
        "url": serializers.URLField(),
        "headers": serializers.DictField(child=serializers.CharField()),
    },
    many=True,
)


SHA256 = serializers.RegexField(r"^[0-9a-f]{64}$", required=False, allow_blank=True, default="")


class OutputFileIn(serializers.Serializer):
    path = PathString()
    sha256 = SHA256


class WorkerOutputCredentialsView(WorkerView):
    class WorkerOutputCredentialsIn(serializers.Serializer):
        """`files` (each with the sha256 the store will hold the upload to), or bare `paths`."""

        files = serializers.ListField(
            child=OutputFileIn(), required=False, allow_empty=False, min_length=1, max_length=1000
        )
        paths = serializers.ListField(
            child=PathString(), required=False, allow_empty=False, min_length=1, max_length=1000
        )

        def validate(self, data):
            if ("files" in data) == ("paths" in data):
                raise serializers.ValidationError("Send either files or paths.")
            return data

    @extend_schema(
        request=WorkerOutputCredentialsIn,
        examples=[
            OpenApiExample(
                "A checkpoint's files",
                {
                    "files": [
                        {
                            "path": "checkpoints/step-00000010/adapter_model.safetensors",
                            "sha256": EXAMPLE_SHA256,
                        }
                    ]
                },
                request_only=True,
            )
        ],
        responses={
            200: inline_serializer("OutputUrls", {"files": OutputUrls}),
        },
    )
    def post(self, request: Request, job_id: str) -> Response:
        data = self.validated(self.WorkerOutputCredentialsIn, request.data)
        if "files" in data:
            urls = worker_services.output_urls(job=self.job, files=data["files"])
        else:
            files = [{"path": path, "sha256": ""} for path in data["paths"]]
            urls = worker_services.output_urls(job=self.job, files=files, sent_as="paths")
        return Response({"files": urls})


class CheckpointFileIn(serializers.Serializer):
    path = PathString()
    size = serializers.IntegerField(min_value=0, max_value=MAX_OBJECT_BYTES)
    sha256 = SHA256


class WorkerCheckpointsView(WorkerView):
    class WorkerCheckpointsIn(serializers.Serializer):
        step = serializers.IntegerField(min_value=0, max_value=MAX_CHECKPOINT_STEP)
        final = serializers.BooleanField(default=False)
        files = serializers.ListField(
            child=CheckpointFileIn(), allow_empty=False, min_length=1, max_length=10_000
        )

    @extend_schema(
        request=WorkerCheckpointsIn,
        examples=[
            OpenApiExample(
                "The final model",
                {"step": 50, "final": True, "files": [{"path": "adapter_config.json", "size": 2}]},
                request_only=True,
            )
        ],
        responses={
            201: inline_serializer(
                "CheckpointAck", {"id": serializers.CharField(), "step": serializers.IntegerField()}
            ),
        },
    )
    def post(self, request: Request, job_id: str) -> Response:
        data = self.validated(self.WorkerCheckpointsIn, request.data)
        checkpoint = worker_services.register_checkpoint(
            job=self.job, step=data["step"], files=data["files"], final=data["final"]
        )
        return Response({"id": checkpoint.public_id, "step": checkpoint.step}, status=201)


class WorkerCompleteView(WorkerView):
    class WorkerCompleteIn(serializers.Serializer):
        ok = serializers.BooleanField()
        error_code = serializers.CharField(
            required=False, allow_null=True, default=None, max_length=64
        )
        message = LossyText(limit=MAX_MESSAGE_CHARS, required=False, default="")

    @extend_schema(
        request=WorkerCompleteIn,
        responses={200: Ack},
        examples=[
            OpenApiExample("Done", {"ok": True}, request_only=True),
            OpenApiExample(
                "Failed",
                {"ok": False, "error_code": "oom", "message": "CUDA out of memory"},
                request_only=True,
            ),
        ],
    )
    def post(self, request: Request, job_id: str) -> Response:
        data = self.validated(self.WorkerCompleteIn, request.data)
        job = worker_services.complete(
            job=self.job, ok=data["ok"], error_code=data["error_code"], message=data["message"]
        )
        return _ok(job)


class WorkerReleaseView(WorkerView):
    authentication_classes = [ReleaseTokenAuthentication]

    @extend_schema(
        request=None,
        responses={200: Ack},
        summary="The machine of an ended job asks to be deleted",
        description="The bootstrap's last act after the worker exits: the control plane deletes "
        "the job's machine through its provider (idempotent). Works with the run's token after "
        "the job ended; 409 `job_not_ended` while the job still runs; another job's token: 404.",
    )
    def post(self, request: Request, job_id: str) -> Response:
        jobs.release_instance(job=self.job)
        return _ok(self.job)
