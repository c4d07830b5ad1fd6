"""`/v1/datasets`, `/v1/training_jobs` (API key) and `/v1/worker/jobs` (job token)."""

from decimal import Decimal

from django.conf import settings
from django.http import HttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema, inline_serializer
from rest_framework import authentication, exceptions, permissions, serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from training import selectors
from training.models import Checkpoint, Dataset, JobEvent, MetricPoint, TrainingJob
from training.services import datasets as dataset_services
from training.services import jobs as job_services
from training.services import logs as log_services
from training.services import worker as worker_services
from veri.api import WorkspaceView, paginate
from veri.errors import NotFound, VeriError
from volumes.api import PlainString
from volumes.services import validate_path
from volumes.stores import get_store

MAX_LOG_LINES = 1000


class DatasetOut(serializers.ModelSerializer):
    id = serializers.CharField(source="public_id")
    volume = serializers.CharField(source="volume_name")
    repo = serializers.CharField(source="hf_repo")
    split = serializers.CharField(source="hf_split")
    revision = serializers.CharField(source="hf_revision")

    class Meta:
        model = Dataset
        fields = [
            "id",
            "source",
            "name",
            "size_bytes",
            "row_count",
            "repo",
            "split",
            "revision",
            "volume",
            "path",
            "created_at",
        ]


class ErrorOut(serializers.Serializer):
    code = serializers.CharField()
    message = serializers.CharField()
    attribution = serializers.CharField()


class JobOut(serializers.ModelSerializer):
    id = serializers.CharField(source="public_id")
    dataset_id = serializers.CharField(source="dataset.public_id")
    resume_from = serializers.CharField(source="resume_from.public_id", default=None)
    error = serializers.SerializerMethodField()
    cost_usd = serializers.SerializerMethodField()
    refund = serializers.SerializerMethodField()

    class Meta:
        model = TrainingJob
        fields = [
            "id",
            "status",
            "method",
            "base_model",
            "dataset_id",
            "output_name",
            "provider",
            "region",
            "gpu_type",
            "gpu_count",
            "hyperparameters",
            "lora",
            "volumes",
            "resume_from",
            "checkpoint_every",
            "checkpoint_keep",
            "heartbeat_timeout_seconds",
            "max_launch_attempts",
            "created_at",
            "provisioning_at",
            "configuring_at",
            "started_at",
            "finished_at",
            "error",
            "cost_usd",
            "cost_attributed_at",
            "billing_deducted_at",
            "refund",
            "last_step",
            "metrics_summary",
        ]

    def get_error(self, job: TrainingJob) -> dict | None:
        if not job.error_code:
            return None
        return {
            "code": job.error_code,
            "message": job.error_message,
            "attribution": job.error_attribution,
        }

    def get_cost_usd(self, job: TrainingJob) -> str | None:
        return None if job.cost_micros is None else str(Decimal(job.cost_micros) / 1_000_000)

    def get_refund(self, job: TrainingJob) -> dict | None:
        return None  # refunds arrive with the billing ledger


class EventOut(serializers.ModelSerializer):
    class Meta:
        model = JobEvent
        fields = ["type", "at", "detail"]


class MetricOut(serializers.ModelSerializer):
    class Meta:
        model = MetricPoint
        fields = ["step", "at", "values"]


class CheckpointOut(serializers.ModelSerializer):
    id = serializers.CharField(source="public_id")
    files = serializers.SerializerMethodField()

    class Meta:
        model = Checkpoint
        fields = ["id", "step", "final", "size_bytes", "created_at", "files"]

    def get_files(self, checkpoint: Checkpoint) -> list[dict]:
        store, request = get_store(), self.context["request"]
        ttl = settings.VERI_PRESIGN_TTL_SECONDS
        return [
            {
                "path": f["path"],
                "size": f["size"],
                "url": request.build_absolute_uri(
                    store.presign_get(checkpoint.prefix + f["path"], expires=ttl)
                ),
            }
            for f in checkpoint.files
        ]


class DatasetsView(WorkspaceView):
    class DatasetsIn(serializers.Serializer):
        source = serializers.ChoiceField(["upload", "hf", "volume"], required=False)
        name = serializers.CharField(required=False, allow_blank=True, max_length=200)
        file = serializers.FileField(required=False)
        repo = serializers.CharField(required=False)
        split = serializers.CharField(required=False, allow_blank=True)
        revision = serializers.CharField(required=False, allow_blank=True)
        volume = serializers.CharField(required=False)
        path = PlainString(required=False)

    @extend_schema(responses=DatasetOut(many=True))
    def get(self, request: Request) -> Response:
        return paginate(request, selectors.list_datasets(workspace=self.workspace), DatasetOut)

    @extend_schema(request=DatasetsIn, responses={201: DatasetOut})
    def post(self, request: Request) -> Response:
        data = self.validated(self.DatasetsIn, request.data)
        source = data.get("source") or ("upload" if "file" in data else None)
        name = data.get("name", "")
        if source == "upload":
            if "file" not in data:
                raise VeriError(
                    "Send the .jsonl as a multipart form field named file.", field="file"
                )
            dataset = dataset_services.create_uploaded_dataset(
                workspace=self.workspace, file=data["file"], name=name
            )
        elif source == "hf":
            if not data.get("repo"):
                raise VeriError("repo is required for a Hugging Face dataset.", field="repo")
            dataset = dataset_services.create_hf_dataset(
                workspace=self.workspace,
                repo=data["repo"],
                split=data.get("split", "train"),
                revision=data.get("revision", "main"),
                name=name,
            )
        elif source == "volume":
            for key in ("volume", "path"):
                if not data.get(key):
                    raise VeriError(f"{key} is required for a volume dataset.", field=key)
            dataset = dataset_services.create_volume_dataset(
                workspace=self.workspace, volume=data["volume"], path=data["path"], name=name
            )
        else:
            raise VeriError(
                'source must be "upload" (with a file), "hf" or "volume".', field="source"
            )
        return Response(DatasetOut(dataset).data, status=201)


class DatasetView(WorkspaceView):
    @extend_schema(responses=DatasetOut)
    def get(self, request: Request, dataset_id: str) -> Response:
        return Response(
            DatasetOut(selectors.get_dataset(workspace=self.workspace, dataset_id=dataset_id)).data
        )


class SubmitIn(serializers.Serializer):
    base_model = serializers.CharField(max_length=500)
    dataset_id = serializers.CharField()
    method = serializers.CharField()
    reward_source = serializers.CharField(
        required=False, allow_blank=True, trim_whitespace=False, default=""
    )
    output_name = serializers.CharField(
        required=False, allow_blank=True, max_length=200, default=""
    )
    hyperparameters = serializers.JSONField(required=False, default=dict)
    lora = serializers.JSONField(required=False, default=None)
    gpu_type = serializers.CharField(required=False, default="cpu")
    gpu_count = serializers.IntegerField(required=False, default=1)
    provider = serializers.CharField(required=False, allow_null=True, default=None)
    region = serializers.CharField(required=False, allow_null=True, default=None)
    volumes = serializers.ListField(child=serializers.CharField(), required=False, default=list)
    resume_from = serializers.CharField(required=False, allow_null=True, default=None)
    checkpoint_every = serializers.IntegerField(required=False, allow_null=True, default=None)
    checkpoint_keep = serializers.IntegerField(required=False, default=2)
    heartbeat_timeout_seconds = serializers.IntegerField(required=False, default=300)
    max_launch_attempts = serializers.IntegerField(required=False, default=3)


class TrainingJobsView(WorkspaceView):
    @extend_schema(responses=JobOut(many=True))
    def get(self, request: Request) -> Response:
        return paginate(request, selectors.list_jobs(workspace=self.workspace), JobOut)

    @extend_schema(request=SubmitIn, responses={201: JobOut})
    def post(self, request: Request) -> Response:
        data = self.validated(SubmitIn, request.data)
        job = job_services.submit_job(
            workspace=self.workspace, submission=job_services.Submission(**data)
        )
        return Response(JobOut(job).data, status=201)


class JobScopedView(WorkspaceView):
    def job(self, job_id: str) -> TrainingJob:
        return selectors.get_job(workspace=self.workspace, job_id=job_id)


class TrainingJobView(JobScopedView):
    @extend_schema(responses=JobOut)
    def get(self, request: Request, job_id: str) -> Response:
        return Response(JobOut(self.job(job_id)).data)


class CancelView(JobScopedView):
    @extend_schema(request=None, responses=JobOut)
    def post(self, request: Request, job_id: str) -> Response:
        return Response(JobOut(job_services.cancel_job(job=self.job(job_id))).data)


class ResumeView(JobScopedView):
    class ResumeIn(serializers.Serializer):
        checkpoint_id = serializers.CharField(required=False, allow_null=True, default=None)

    @extend_schema(request=ResumeIn, responses={201: JobOut})
    def post(self, request: Request, job_id: str) -> Response:
        data = self.validated(self.ResumeIn, request.data)
        new = job_services.resume_job(job=self.job(job_id), checkpoint_id=data["checkpoint_id"])
        return Response(JobOut(new).data, status=201)


class LogsView(JobScopedView):
    @extend_schema(
        parameters=[OpenApiParameter("after", int), OpenApiParameter("limit", int)],
        responses=inline_serializer(
            "LogLines",
            {
                "lines": inline_serializer(
                    "LogLine",
                    {
                        "seq": serializers.IntegerField(),
                        "at": serializers.DateTimeField(),
                        "text": serializers.CharField(),
                    },
                    many=True,
                ),
                "next_seq": serializers.IntegerField(),
                "finished": serializers.BooleanField(),
            },
        ),
    )
    def get(self, request: Request, job_id: str) -> Response:
        job = self.job(job_id)
        try:
            after = int(request.query_params.get("after", -1))
            limit = int(request.query_params.get("limit", MAX_LOG_LINES))
        except ValueError:
            raise VeriError("after and limit must be whole numbers.", field="after") from None
        lines = selectors.log_lines_after(
            job=job, after=after, limit=max(1, min(limit, MAX_LOG_LINES))
        )
        next_seq = lines[-1].seq if lines else after
        return Response(
            {
                "lines": [{"seq": line.seq, "at": line.at, "text": line.text} for line in lines],
                "next_seq": next_seq,
                "finished": job.is_terminal and len(lines) < limit,
            }
        )


class FullLogView(JobScopedView):
    @extend_schema(responses={(200, "text/plain"): str})
    def get(self, request: Request, job_id: str) -> HttpResponse:
        job = self.job(job_id)
        text = log_services.archived_text(job=job) if job.is_terminal else None
        if text is None:
            text = log_services.full_text(job=job)
        if not text and job.is_terminal:
            raise NotFound("log was never uploaded for this job", code="log_not_uploaded")
        return HttpResponse(text, content_type="text/plain; charset=utf-8")


class EventsView(JobScopedView):
    @extend_schema(responses=EventOut(many=True))
    def get(self, request: Request, job_id: str) -> Response:
        return paginate(
            request, selectors.list_events(job=self.job(job_id)), EventOut, order_by="pk"
        )


class MetricsView(JobScopedView):
    @extend_schema(responses=MetricOut(many=True))
    def get(self, request: Request, job_id: str) -> Response:
        return paginate(
            request, selectors.list_metrics(job=self.job(job_id)), MetricOut, order_by="step"
        )


class CheckpointsView(JobScopedView):
    @extend_schema(responses=CheckpointOut(many=True))
    def get(self, request: Request, job_id: str) -> Response:
        return paginate(
            request, selectors.list_checkpoints(job=self.job(job_id)), CheckpointOut, order_by="pk"
        )


# The worker's side: a job token, good for its own job only.


class JobTokenAuthentication(authentication.BaseAuthentication):
    def authenticate(self, request: Request):
        header = authentication.get_authorization_header(request).decode("latin-1")
        scheme, _, raw = header.partition(" ")
        if scheme != "Bearer" or not raw.strip():
            return None
        job = worker_services.authenticate_job_token(raw=raw.strip())
        if job is None:
            raise exceptions.AuthenticationFailed(
                "This job token is not valid, or its job has finished."
            )
        return None, job

    def authenticate_header(self, request: Request) -> str:
        return "Bearer"


class HasJobToken(permissions.BasePermission):
    def has_permission(self, request, view) -> bool:
        return isinstance(request.auth, TrainingJob)


class WorkerView(APIView):
    authentication_classes = [JobTokenAuthentication]
    permission_classes = [HasJobToken]

    def initial(self, request: Request, *args, **kwargs) -> None:
        super().initial(request, *args, **kwargs)
        if request.auth.public_id != kwargs.get("job_id"):
            raise NotFound("Not found.")  # a token opens its own job only
        self.job = request.auth

    def validated(self, serializer_class, data) -> dict:
        serializer = serializer_class(data=data)
        serializer.is_valid(raise_exception=True)
        return serializer.validated_data


def _ok(job: TrainingJob, **extra) -> Response:
    return Response({"status": job.status, **extra})


class WorkerRegisterView(WorkerView):
    @extend_schema(
        request=OpenApiTypes.OBJECT,
        responses=inline_serializer("WorkerAck", {"status": serializers.CharField()}),
    )
    def post(self, request: Request, job_id: str) -> Response:
        return _ok(worker_services.register(job=self.job, info=dict(request.data)))


class WorkerSpecView(WorkerView):
    @extend_schema(responses=OpenApiTypes.OBJECT)
    def get(self, request: Request, job_id: str) -> Response:
        spec = worker_services.build_spec(job=self.job)
        if url := spec["dataset"].get("url"):
            spec["dataset"]["url"] = request.build_absolute_uri(url)
        for file in (spec["resume_from"] or {}).get("files", []):
            file["url"] = request.build_absolute_uri(file["url"])
        return Response(spec)


class WorkerStatusView(WorkerView):
    class WorkerStatusIn(serializers.Serializer):
        status = serializers.CharField()

    @extend_schema(request=WorkerStatusIn, responses=OpenApiTypes.OBJECT)
    def post(self, request: Request, job_id: str) -> Response:
        status = self.validated(self.WorkerStatusIn, request.data)["status"]
        return _ok(worker_services.report_status(job=self.job, status=status))


class WorkerHeartbeatView(WorkerView):
    class WorkerHeartbeatIn(serializers.Serializer):
        step = serializers.IntegerField(required=False, allow_null=True, min_value=0, default=None)

    @extend_schema(request=WorkerHeartbeatIn, responses=OpenApiTypes.OBJECT)
    def post(self, request: Request, job_id: str) -> Response:
        worker_services.heartbeat(
            job=self.job, step=self.validated(self.WorkerHeartbeatIn, request.data)["step"]
        )
        return _ok(self.job)


class WorkerLogsView(WorkerView):
    class Line(serializers.Serializer):
        seq = serializers.IntegerField(min_value=0)
        text = serializers.CharField(allow_blank=True, trim_whitespace=False)
        at = serializers.DateTimeField(required=False)

    class WorkerLogsIn(serializers.Serializer):
        lines = serializers.ListField(child=serializers.DictField(), max_length=5000)

    @extend_schema(request=WorkerLogsIn, responses=OpenApiTypes.OBJECT)
    def post(self, request: Request, job_id: str) -> Response:
        raw = self.validated(self.WorkerLogsIn, request.data)["lines"]
        lines = serializers.ListSerializer(child=self.Line(), data=raw)
        lines.is_valid(raise_exception=True)
        added = worker_services.append_logs(job=self.job, lines=lines.validated_data)
        return _ok(self.job, added=added)


class WorkerMetricsView(WorkerView):
    class Point(serializers.Serializer):
        step = serializers.IntegerField(min_value=0)
        values = serializers.DictField(child=serializers.FloatField(allow_null=True))
        at = serializers.DateTimeField(required=False)

    @extend_schema(request=OpenApiTypes.OBJECT, responses=OpenApiTypes.OBJECT)
    def post(self, request: Request, job_id: str) -> Response:
        points = serializers.ListSerializer(child=self.Point(), data=request.data.get("points"))
        points.is_valid(raise_exception=True)
        return _ok(
            self.job,
            added=worker_services.record_metrics(job=self.job, points=points.validated_data),
        )


class WorkerVolumeCredentialsView(WorkerView):
    @extend_schema(request=None, responses=OpenApiTypes.OBJECT)
    def post(self, request: Request, job_id: str) -> Response:
        answer = worker_services.volume_credentials(job=self.job)
        for volume in answer["volumes"]:
            for file in volume["files"]:
                if "url" in file:
                    file["url"] = request.build_absolute_uri(file["url"])
        return Response(answer)


class WorkerOutputCredentialsView(WorkerView):
    class WorkerOutputCredentialsIn(serializers.Serializer):
        paths = serializers.ListField(child=PlainString(), allow_empty=False, max_length=1000)

    @extend_schema(request=WorkerOutputCredentialsIn, responses=OpenApiTypes.OBJECT)
    def post(self, request: Request, job_id: str) -> Response:
        paths = self.validated(self.WorkerOutputCredentialsIn, request.data)["paths"]
        for index, path in enumerate(paths):
            validate_path(path, field=f"paths.{index}")
        urls = worker_services.output_urls(job=self.job, paths=paths)
        for entry in urls:
            entry["url"] = request.build_absolute_uri(entry["url"])
        return Response({"files": urls})


class WorkerCheckpointsView(WorkerView):
    class File(serializers.Serializer):
        path = PlainString()
        size = serializers.IntegerField(min_value=0)

    class WorkerCheckpointsIn(serializers.Serializer):
        step = serializers.IntegerField(min_value=0)
        final = serializers.BooleanField(default=False)
        files = serializers.ListField(child=serializers.DictField(), allow_empty=False)

    @extend_schema(request=WorkerCheckpointsIn, responses=OpenApiTypes.OBJECT)
    def post(self, request: Request, job_id: str) -> Response:
        data = self.validated(self.WorkerCheckpointsIn, request.data)
        files = serializers.ListSerializer(child=self.File(), data=data["files"])
        files.is_valid(raise_exception=True)
        checkpoint = worker_services.register_checkpoint(
            job=self.job, step=data["step"], files=files.validated_data, final=data["final"]
        )
        return Response({"id": checkpoint.public_id, "step": checkpoint.step}, status=201)


class WorkerCompleteView(WorkerView):
    class WorkerCompleteIn(serializers.Serializer):
        ok = serializers.BooleanField()
        error_code = serializers.CharField(required=False, allow_null=True, default=None)
        message = serializers.CharField(
            required=False, allow_blank=True, default="", trim_whitespace=False
        )

    @extend_schema(request=WorkerCompleteIn, responses=OpenApiTypes.OBJECT)
    def post(self, request: Request, job_id: str) -> Response:
        data = self.validated(self.WorkerCompleteIn, request.data)
        return _ok(
            worker_services.complete(
                job=self.job, ok=data["ok"], error_code=data["error_code"], message=data["message"]
            )
        )
