"""`/v1/datasets`, `/v1/training_jobs` (API key) and `/v1/worker/jobs` (job token)."""

from django.http import StreamingHttpResponse
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

from training import hooks, selectors
from training.models import (
    MAX_SEQ,
    Checkpoint,
    Dataset,
    JobEvent,
    MetricPoint,
    Sample,
    TrainingJob,
)
from training.services import datasets as dataset_services
from training.services import jobs as job_services
from training.services import logs as log_services
from training.services import quotes as quote_services
from training.services import timings as job_timings
from veri.api import WorkspaceView, list_schema, paginate, query_int
from veri.errors import NotFound, VeriError
from veri.money import usd
from volumes.api import PathString

MAX_LOG_LINES = 1000
EXAMPLE_DATASET_ID = "ds_0123456789abcdef"  # in the schema's examples


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


class RefundOut(serializers.Serializer):
    status = serializers.ChoiceField(["pending", "approved", "credited", "denied"])
    amount_usd = serializers.CharField()


class RestartOut(serializers.Serializer):
    """A run that a platform fault ended and Veri restarted from its newest checkpoint."""

    attempt = serializers.IntegerField()
    cause = serializers.CharField()
    message = serializers.CharField()
    instance = serializers.CharField()
    launched_at = serializers.DateTimeField(allow_null=True)
    ended_at = serializers.DateTimeField()
    from_step = serializers.IntegerField()
    checkpoint_step = serializers.IntegerField(allow_null=True)
    kept_usd = serializers.CharField(help_text="compute up to its last checkpoint: charged")
    lost_usd = serializers.CharField(help_text="compute after it: credited back")
    credited_usd = serializers.CharField(
        allow_null=True, help_text="the credit for lost_usd once the job settles (null before)"
    )


class LedgerLineOut(serializers.Serializer):
    """A ledger entry written for the job: its charge, or money credited back, and why."""

    kind = serializers.ChoiceField(["job_charge", "refund_credit", "adjustment"])
    reason = serializers.CharField(
        help_text="compute (the charge), lost_compute (a restarted run's compute after its last "
        "checkpoint), refund (a failed job's refund), or adjustment (an operator's)"
    )
    amount_usd = serializers.CharField(help_text="negative for the charge, positive for a credit")
    description = serializers.CharField()
    attempt = serializers.IntegerField(
        allow_null=True, help_text="the restarted run a lost_compute credit is for"
    )
    at = serializers.DateTimeField()


class TimingsOut(serializers.Serializer):
    queued_at = serializers.DateTimeField(help_text="submitted, or restarted, for this run")
    launched_at = serializers.DateTimeField(
        allow_null=True, help_text="the provider accepted the machine's launch"
    )
    registered_at = serializers.DateTimeField(
        allow_null=True, help_text="the worker on the machine came up and registered"
    )
    volumes_synced_at = serializers.DateTimeField(
        allow_null=True, help_text="the mounted volumes were synced (the worker's report)"
    )
    model_loaded_at = serializers.DateTimeField(
        allow_null=True, help_text="the base model was loaded (the worker's report)"
    )
    first_step_at = serializers.DateTimeField(
        allow_null=True, help_text="the first training step ended (the worker's report)"
    )
    first_checkpoint_at = serializers.DateTimeField(
        allow_null=True, help_text="the run's first checkpoint (or final model) was saved"
    )
    synced_bytes = serializers.IntegerField(allow_null=True)
    sync_seconds = serializers.FloatField(allow_null=True)
    sync_bytes_per_second = serializers.FloatField(allow_null=True)
    until_first_step_seconds = serializers.FloatField(
        allow_null=True, help_text="from queued to the first step: the run's start-up"
    )


class JobOut(serializers.ModelSerializer):
    id = serializers.CharField(source="public_id")
    dataset_id = serializers.CharField(source="dataset.public_id")
    validation_dataset_id = serializers.CharField(
        source="validation_dataset.public_id", default=None, allow_null=True
    )
    resume_from = serializers.CharField(
        source="resume_from.public_id", default=None, allow_null=True
    )
    adapter_from = serializers.CharField(
        source="adapter_from.public_id", default=None, allow_null=True
    )
    error = serializers.SerializerMethodField()
    cost_usd = serializers.SerializerMethodField()
    cost_attributed_at = serializers.SerializerMethodField()
    billing_deducted_at = serializers.SerializerMethodField()
    max_cost_usd = serializers.SerializerMethodField()
    refund = serializers.SerializerMethodField()
    restarts = serializers.SerializerMethodField()
    credited_usd = serializers.SerializerMethodField()
    net_cost_usd = serializers.SerializerMethodField()
    ledger = serializers.SerializerMethodField()
    timings = serializers.SerializerMethodField()

    class Meta:
        model = TrainingJob
        fields = [
            "id",
            "status",
            "method",
            "base_model",
            "dataset_id",
            "validation_dataset_id",
            "output_name",
            "provider",
            "region",
            "gpu_type",
            "gpu_count",
            "hyperparameters",
            "lora",
            "volumes",
            "resume_from",
            "adapter_from",
            "checkpoint_every",
            "checkpoint_keep",
            "heartbeat_timeout_seconds",
            "max_launch_attempts",
            "max_cost_usd",
            "auto_resume",
            "max_restarts",
            "integrations",
            "attempt",
            "restarts",
            "inputs_digest",
            "created_at",
            "provisioning_at",
            "configuring_at",
            "started_at",
            "finished_at",
            "timings",
            "error",
            "cost_usd",
            "cost_attributed_at",
            "billing_deducted_at",
            "refund",
            "credited_usd",
            "net_cost_usd",
            "ledger",
            "last_step",
            "metrics_summary",
        ]

    @extend_schema_field(ErrorOut(allow_null=True))
    def get_error(self, job: TrainingJob) -> dict | None:
        return job_services.job_error(job)

    def _money(self, job: TrainingJob) -> hooks.JobMoney:
        """Billing keeps a job's money; asked once per job through the hook (no query when the
        job came from `selectors`, which select billing's record and refund)."""
        cached = getattr(job, "_veri_money", None)
        if cached is None:
            cached = job._veri_money = hooks.money().job_money(job=job)
        return cached

    @extend_schema_field(serializers.CharField(allow_null=True))
    def get_cost_usd(self, job: TrainingJob) -> str | None:
        return _usd_or_none(self._money(job).cost_micros)

    @extend_schema_field(serializers.DateTimeField(allow_null=True))
    def get_cost_attributed_at(self, job: TrainingJob) -> str | None:
        return _datetime(self._money(job).cost_attributed_at)

    @extend_schema_field(serializers.DateTimeField(allow_null=True))
    def get_billing_deducted_at(self, job: TrainingJob) -> str | None:
        return _datetime(self._money(job).billing_deducted_at)

    @extend_schema_field(serializers.CharField(allow_null=True))
    def get_max_cost_usd(self, job: TrainingJob) -> str | None:
        return _usd_or_none(job.max_cost_micros)

    @extend_schema_field(RestartOut(many=True))
    def get_restarts(self, job: TrainingJob) -> list[dict]:
        return [
            {
                "attempt": a.number,
                "cause": a.cause,
                "message": a.message,
                "instance": f"{a.provider}:{a.instance_id}",
                "launched_at": a.launched_at,
                "ended_at": a.ended_at,
                "from_step": a.from_step,
                "checkpoint_step": a.checkpoint_step,
                "kept_usd": usd(a.kept_micros),
                "lost_usd": usd(a.lost_micros),
                "credited_usd": _usd_or_none(self._money(job).credit_for_attempt(a.number)),
            }
            for a in job.attempts.all()
        ]

    @extend_schema_field(serializers.CharField())
    def get_credited_usd(self, job: TrainingJob) -> str:
        return usd(self._money(job).credited_micros)

    @extend_schema_field(serializers.CharField(allow_null=True))
    def get_net_cost_usd(self, job: TrainingJob) -> str | None:
        return _usd_or_none(self._money(job).net_micros)

    @extend_schema_field(LedgerLineOut(many=True))
    def get_ledger(self, job: TrainingJob) -> list[dict]:
        return [
            {
                "kind": e.kind,
                "reason": e.reason,
                "amount_usd": usd(e.amount_micros),
                "description": e.description,
                "attempt": e.attempt,
                "at": _datetime(e.at),
            }
            for e in self._money(job).entries
        ]

    @extend_schema_field(TimingsOut)
    def get_timings(self, job: TrainingJob) -> dict:
        return TimingsOut(job_timings.of(job)).data

    @extend_schema_field(RefundOut(allow_null=True))
    def get_refund(self, job: TrainingJob) -> dict | None:
        money = self._money(job)
        if money.refund_status is None:
            return None
        return {"status": money.refund_status, "amount_usd": usd(money.refund_micros or 0)}


def _usd_or_none(micros: int | None) -> str | None:
    return None if micros is None else usd(micros)


def _datetime(value) -> str | None:
    """As a model's DateTimeField renders (the API's one format for times)."""
    return None if value is None else serializers.DateTimeField().to_representation(value)


class EventOut(serializers.ModelSerializer):
    class Meta:
        model = JobEvent
        fields = ["type", "at", "detail"]


class MetricOut(serializers.ModelSerializer):
    class Meta:
        model = MetricPoint
        fields = ["step", "at", "values"]


class SampleOut(serializers.ModelSerializer):
    class Meta:
        model = Sample
        fields = ["step", "index", "prompt", "completion", "reward", "rewards", "at"]


class CheckpointOut(serializers.ModelSerializer):
    id = serializers.CharField(source="public_id")
    files = serializers.SerializerMethodField()

    class Meta:
        model = Checkpoint
        fields = ["id", "step", "final", "size_bytes", "created_at", "files"]

    @extend_schema_field(
        inline_serializer(
            "CheckpointFile",
            {
                "path": serializers.CharField(),
                "size": serializers.IntegerField(),
                "sha256": serializers.CharField(help_text="empty when the worker sent none"),
                "url": serializers.URLField(),
            },
            many=True,
        )
    )
    def get_files(self, checkpoint: Checkpoint) -> list[dict]:
        return selectors.checkpoint_files(checkpoint=checkpoint)


class DatasetsView(WorkspaceView):
    class DatasetsIn(serializers.Serializer):
        source = serializers.ChoiceField(["upload", "hf", "volume"], required=False)
        name = serializers.CharField(required=False, allow_blank=True, max_length=200)
        file = serializers.FileField(required=False)
        repo = serializers.CharField(required=False)
        split = serializers.CharField(required=False, allow_blank=True)
        revision = serializers.CharField(required=False, allow_blank=True)
        volume = serializers.CharField(required=False)
        path = PathString(required=False)

    @list_schema(DatasetOut, name="DatasetPage", operation_id="datasets_list")
    def get(self, request: Request) -> Response:
        return paginate(request, selectors.list_datasets(workspace=self.workspace), DatasetOut)

    @extend_schema(
        request=DatasetsIn,
        responses={201: DatasetOut, 200: DatasetOut},
        description=(
            "201 with a new dataset; 200 with the existing one when the upload's bytes are "
            "already a dataset of this workspace (same content, same id)."
        ),
        examples=[
            OpenApiExample(
                "A file in a volume",
                {"source": "volume", "volume": "corpus", "path": "train.jsonl"},
                request_only=True,
            ),
            OpenApiExample(
                "A Hugging Face dataset",
                {"source": "hf", "repo": "openai/gsm8k", "split": "train"},
                request_only=True,
            ),
        ],
    )
    def post(self, request: Request) -> Response:
        data = self.validated(self.DatasetsIn, request.data)
        source = data.get("source") or ("upload" if "file" in data else None)
        name = data.get("name", "")
        created = True
        if source == "upload":
            if "file" not in data:
                raise VeriError(
                    "Send the .jsonl as a multipart form field named file.", field="file"
                )
            dataset, created = dataset_services.create_uploaded_dataset(
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
        return Response(DatasetOut(dataset).data, status=201 if created else 200)


class DatasetView(WorkspaceView):
    @extend_schema(responses=DatasetOut)
    def get(self, request: Request, dataset_id: str) -> Response:
        return Response(
            DatasetOut(selectors.get_dataset(workspace=self.workspace, dataset_id=dataset_id)).data
        )

    @extend_schema(responses={204: None})
    def delete(self, request: Request, dataset_id: str) -> Response:
        dataset_services.delete_dataset(
            dataset=selectors.get_dataset(workspace=self.workspace, dataset_id=dataset_id)
        )
        return Response(status=204)


class DatasetPreviewView(WorkspaceView):
    @extend_schema(
        parameters=[
            OpenApiParameter(
                "rows",
                int,
                description=f"how many rows (default {dataset_services.PREVIEW_ROWS}, "
                f"at most {dataset_services.PREVIEW_MAX_ROWS})",
            )
        ],
        responses=inline_serializer(
            "DatasetPreview",
            {
                "id": serializers.CharField(),
                "rows": serializers.ListField(
                    child=serializers.JSONField(),
                    help_text="each row's JSON value; a line that is not JSON, as its text",
                ),
            },
        ),
    )
    def get(self, request: Request, dataset_id: str) -> Response:
        dataset = selectors.get_dataset(workspace=self.workspace, dataset_id=dataset_id)
        rows = query_int(
            request,
            "rows",
            dataset_services.PREVIEW_ROWS,
            low=1,
            high=dataset_services.PREVIEW_MAX_ROWS,
        )
        rows = dataset_services.preview_dataset(dataset=dataset, rows=rows)
        return Response({"id": dataset.public_id, "rows": rows})


class SubmitIn(serializers.Serializer):
    """What a submit may say; a field left out takes `Submission`'s default (defined there only)."""

    base_model = PathString()  # volume://<volume>/<path>: the path in its one spelling
    dataset_id = serializers.CharField()
    validation_dataset_id = serializers.CharField(
        required=False,
        allow_null=True,
        help_text="evaluated every eval_interval steps (eval_loss…), never trained on",
    )
    method = serializers.CharField()
    reward_source = serializers.CharField(required=False, allow_blank=True, trim_whitespace=False)
    output_name = serializers.CharField(required=False, allow_blank=True, max_length=200)
    hyperparameters = serializers.JSONField(required=False)
    lora = serializers.JSONField(required=False)
    gpu_type = serializers.CharField(required=False)
    gpu_count = serializers.IntegerField(required=False)
    provider = serializers.CharField(required=False, allow_null=True)
    region = serializers.CharField(required=False, allow_null=True)
    volumes = serializers.ListField(
        child=serializers.CharField(max_length=128), required=False, max_length=32
    )
    resume_from = serializers.CharField(required=False, allow_null=True)
    adapter_from = serializers.CharField(
        required=False,
        allow_null=True,
        help_text="a checkpoint's id: train on from its adapter, at step 0, on base_model",
    )
    checkpoint_every = serializers.IntegerField(required=False, allow_null=True)
    checkpoint_keep = serializers.IntegerField(required=False)
    heartbeat_timeout_seconds = serializers.IntegerField(required=False)
    max_launch_attempts = serializers.IntegerField(required=False)
    max_cost_usd = serializers.DecimalField(
        max_digits=13, decimal_places=6, required=False, allow_null=True
    )
    auto_resume = serializers.BooleanField(required=False)
    max_restarts = serializers.IntegerField(required=False)
    integrations = serializers.JSONField(
        required=False,
        help_text='[{"type": "wandb", "wandb": {"project", "name", "entity", "tags"}}]: the '
        "job's metrics logged to W&B with the workspace's WANDB_API_KEY secret",
    )


class TrainingJobsView(WorkspaceView):
    @list_schema(JobOut, name="JobPage", operation_id="training_jobs_list")
    def get(self, request: Request) -> Response:
        return paginate(request, selectors.list_jobs(workspace=self.workspace), JobOut)

    @extend_schema(
        request=SubmitIn,
        responses={201: JobOut},
        examples=[
            OpenApiExample(
                "GRPO on a model kept in a volume",
                {
                    "base_model": "volume://corpus/models/m",
                    "dataset_id": EXAMPLE_DATASET_ID,
                    "method": "grpo",
                    "reward_source": "def reward(completions, **kw):\n"
                    "    return [float('a' in c) for c in completions]\n",
                    "hyperparameters": {"max_steps": 50, "rollouts_per_prompt": 8},
                    "gpu_type": "cpu",
                    "checkpoint_every": 10,
                },
                request_only=True,
            )
        ],
    )
    def post(self, request: Request) -> Response:
        data = self.validated(SubmitIn, request.data)
        job = job_services.submit_job(
            workspace=self.workspace, submission=job_services.Submission(**data)
        )
        return Response(JobOut(job).data, status=201)


QuoteRange = inline_serializer(
    "QuoteRange",
    {
        "low": serializers.CharField(),
        "expected": serializers.CharField(),
        "high": serializers.CharField(),
    },
)
QuoteOut = inline_serializer(
    "Quote",
    {
        "provider": serializers.CharField(),
        "region": serializers.CharField(),
        "gpu_type": serializers.CharField(),
        "gpu_count": serializers.IntegerField(),
        "price_per_hour_usd": serializers.CharField(),
        "gpu_seconds": inline_serializer(
            "QuoteSeconds",
            {
                "low": serializers.IntegerField(),
                "expected": serializers.IntegerField(),
                "high": serializers.IntegerField(),
            },
        ),
        "cost_usd": QuoteRange,
        "max_cost_usd": serializers.CharField(allow_null=True),
        "assumptions": serializers.DictField(),
    },
)


class QuoteView(WorkspaceView):
    @extend_schema(request=SubmitIn, responses={200: QuoteOut})
    def post(self, request: Request) -> Response:
        """What the job would cost, with the assumptions used; rents and writes nothing."""
        data = self.validated(SubmitIn, request.data)
        quote = quote_services.quote_job(
            workspace=self.workspace, submission=job_services.Submission(**data)
        )
        price, cap = quote.pop("price_per_hour_micros"), quote.pop("max_cost_micros")
        costs = quote.pop("cost_micros")
        return Response(
            quote
            | {
                "price_per_hour_usd": usd(price),
                "cost_usd": {k: usd(v) for k, v in costs.items()},
                "max_cost_usd": _usd_or_none(cap),
            }
        )


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
        after = query_int(request, "after", -1, low=-1, high=MAX_SEQ)
        # A longer page than the server gives is not an error: it gets the longest there is.
        limit = min(query_int(request, "limit", MAX_LOG_LINES, low=1, high=MAX_SEQ), MAX_LOG_LINES)
        lines = selectors.log_lines_after(job=job, after=after, limit=limit)
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
    def get(self, request: Request, job_id: str) -> StreamingHttpResponse:
        """Streamed a page at a time, from the store or the database: a log of any size costs
        the server the same memory."""
        job = self.job(job_id)
        chunks = log_services.full_log(job=job)
        if chunks is None:
            raise NotFound("log was never uploaded for this job", code="log_not_uploaded")
        return StreamingHttpResponse(chunks, content_type="text/plain; charset=utf-8")


class EventsView(JobScopedView):
    @list_schema(EventOut, name="EventPage", operation_id="training_jobs_events_list")
    def get(self, request: Request, job_id: str) -> Response:
        return paginate(
            request, selectors.list_events(job=self.job(job_id)), EventOut, order_by="pk"
        )


class MetricsView(JobScopedView):
    @list_schema(MetricOut, name="MetricPage", operation_id="training_jobs_metrics_list")
    def get(self, request: Request, job_id: str) -> Response:
        return paginate(
            request, selectors.list_metrics(job=self.job(job_id)), MetricOut, order_by="step"
        )


class CheckpointsView(JobScopedView):
    @list_schema(
        CheckpointOut, name="CheckpointPage", operation_id="training_jobs_checkpoints_list"
    )
    def get(self, request: Request, job_id: str) -> Response:
        return paginate(
            request, selectors.list_checkpoints(job=self.job(job_id)), CheckpointOut, order_by="pk"
        )


class SamplesView(JobScopedView):
    @list_schema(SampleOut, name="SamplePage", operation_id="training_jobs_samples_list")
    def get(self, request: Request, job_id: str) -> Response:
        """GRPO: completions the worker sampled every few steps, with each reward."""
        return paginate(
            request, selectors.list_samples(job=self.job(job_id)), SampleOut, order_by="pk"
        )
