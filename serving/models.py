"""Deployments (a base model plus adapters, served by replicas), their replicas and events."""

from django.core.validators import MinValueValidator
from django.db import models
from django.utils import timezone

from veri.models import Workspace, public_id_field
from volumes.stores import keys


class DeploymentStatus(models.TextChoices):
    PENDING = "pending"  # written, no replica launched yet
    STARTING = "starting"  # a replica is launching or loading the model
    READY = "ready"  # a replica answers
    SCALING_DOWN = "scaling_down"  # its replicas are being stopped
    STOPPED = "stopped"  # no replica: scaled to zero (a request wakes it) or deleted
    FAILED = "failed"  # could not serve: `error_code` says why


class Deployment(models.Model):
    public_id = public_id_field("dep")
    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="deployments")
    base_model = models.CharField(max_length=500)
    # [{"name", "checkpoint_id"}]: each name (an `ft:` model, or the checkpoint's id) routes
    # to that checkpoint's adapter.
    adapters = models.JSONField(default=list)
    gpu_type = models.CharField(max_length=60)
    gpu_count = models.PositiveSmallIntegerField(default=1)
    provider = models.CharField(max_length=30)
    region = models.CharField(max_length=40)
    min_replicas = models.PositiveSmallIntegerField(default=0)
    max_replicas = models.PositiveSmallIntegerField(default=1)
    idle_timeout_seconds = models.PositiveIntegerField(default=900)
    status = models.CharField(
        max_length=20, choices=DeploymentStatus.choices, default=DeploymentStatus.PENDING
    )
    error_code = models.CharField(max_length=60, blank=True)
    error_message = models.TextField(blank=True)
    error_attribution = models.CharField(max_length=20, blank=True)
    last_active_at = models.DateTimeField(null=True)  # its last request, or when it became ready
    # Since when its in-flight requests per ready replica have been over the target (null: not).
    loaded_since = models.DateTimeField(null=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"{self.public_id} ({self.base_model}, {self.status})"

    @property
    def pin_holder(self) -> str:
        """Who holds the pin on the base model's volume files (see volumes.services.pin_files)."""
        return f"deployment:{self.public_id}"

    @property
    def workspace_prefix(self) -> keys.Prefix:
        return keys.workspace_prefix(self.workspace.public_id)

    def served_names(self) -> set[str]:
        return {self.base_model} | {a["name"] for a in self.adapters}


class ReplicaStatus(models.TextChoices):
    STARTING = "starting"
    READY = "ready"
    STOPPED = "stopped"
    FAILED = "failed"


REPLICA_LIVE = [ReplicaStatus.STARTING, ReplicaStatus.READY]


class Replica(models.Model):
    """One serving process on one machine, launched through the deployment's provider."""

    public_id = public_id_field("rep")
    deployment = models.ForeignKey(Deployment, on_delete=models.CASCADE, related_name="replicas")
    status = models.CharField(
        max_length=20, choices=ReplicaStatus.choices, default=ReplicaStatus.STARTING
    )
    provider = models.CharField(max_length=30)
    external_id = models.CharField(max_length=200, blank=True)  # empty while launching
    token_hash = models.CharField(max_length=64, blank=True, db_index=True)
    url = models.CharField(max_length=300, blank=True)  # where the serving process listens
    error_code = models.CharField(max_length=60, blank=True)
    error_message = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    ready_at = models.DateTimeField(null=True)
    last_heartbeat_at = models.DateTimeField(null=True)
    stopped_at = models.DateTimeField(null=True)
    # Uptime is charged per second from `ready_at` (a replica that never became ready costs
    # nothing), at least hourly and when it stops, up to `charged_until`.
    price_per_hour_micros = models.PositiveBigIntegerField(default=0)
    charged_until = models.DateTimeField(null=True)
    requests = models.PositiveBigIntegerField(default=0)  # routed to it, for the spread's sake

    def __str__(self) -> str:
        return f"{self.public_id} ({self.status})"


class DeploymentEvent(models.Model):
    deployment = models.ForeignKey(Deployment, on_delete=models.CASCADE, related_name="events")
    type = models.CharField(max_length=40)
    detail = models.JSONField(default=dict)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes = [models.Index(fields=["deployment", "id"])]

    def __str__(self) -> str:
        return f"{self.type} at {self.created_at}"


class EvaluationStatus(models.TextChoices):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"  # `error_code` (serving.services.evaluations.ERRORS) says why


class Evaluation(models.Model):
    """Two models (`model` and `baseline`) answering every row of a held-out dataset, each answer
    scored by one grader; `summary` holds the means, their confidence intervals and the win
    rate once it succeeded."""

    public_id = public_id_field("eval")
    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="evaluations")
    model = models.CharField(max_length=500)
    baseline = models.CharField(max_length=500)
    # The file as given (a dataset id or an OpenAI file id); the dataset may be deleted later,
    # the samples keep their rows.
    file = models.CharField(max_length=100)
    dataset = models.ForeignKey(
        "training.Dataset", on_delete=models.SET_NULL, null=True, related_name="evaluations"
    )
    grader = models.JSONField()  # a checked OpenAI-style grader object
    # When the evaluation was given reward functions: their source (`grader` calls them).
    reward_source = models.TextField(blank=True)
    max_tokens = models.PositiveIntegerField()
    temperature = models.FloatField()
    status = models.CharField(
        max_length=20, choices=EvaluationStatus.choices, default=EvaluationStatus.QUEUED
    )
    error_code = models.CharField(max_length=60, blank=True)
    error_message = models.TextField(blank=True)
    summary = models.JSONField(default=dict)
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True)
    finished_at = models.DateTimeField(null=True)
    # Its last sign of life (created, an answer or a score saved, its task re-queued): an
    # unfinished evaluation quiet for long has lost its task, and is queued again.
    progress_at = models.DateTimeField(default=timezone.now)

    class Meta:
        indexes = [models.Index(fields=["status", "progress_at"])]

    def __str__(self) -> str:
        return f"{self.public_id} ({self.model} vs {self.baseline}, {self.status})"


class EvaluationSample(models.Model):
    """One row of the file: the prompt both models answered, the row the grader reads as its
    `item`, and each model's output and score (empty until answered and scored)."""

    evaluation = models.ForeignKey(Evaluation, on_delete=models.CASCADE, related_name="samples")
    index = models.PositiveIntegerField()  # the row's place in the file, from 0
    prompt = models.JSONField()  # a list of chat messages, or a text prompt
    item = models.JSONField()
    # null: not answered yet ("" is an answer)
    model_output = models.TextField(null=True)  # noqa: DJ001
    model_score = models.FloatField(null=True)
    model_grader_error = models.TextField(blank=True)
    baseline_output = models.TextField(null=True)  # noqa: DJ001
    baseline_score = models.FloatField(null=True)
    baseline_grader_error = models.TextField(blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["evaluation", "index"], name="one_sample_per_row")
        ]

    def __str__(self) -> str:
        return f"{self.evaluation_id}#{self.index}"


class InflightRequest(models.Model):
    """An inference request the router holds: queued (no replica yet) or forwarded to `replica`.
    A row, not a counter in one web process's memory: every web process sees the others', and a
    process that crashed mid-request leaves rows that stop counting at `expires_at` (a running
    stream pushes it on as it goes)."""

    deployment = models.ForeignKey(Deployment, on_delete=models.CASCADE, related_name="inflight")
    replica = models.ForeignKey(
        Replica, on_delete=models.CASCADE, null=True, related_name="inflight"
    )
    started_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField(db_index=True)

    def __str__(self) -> str:
        return f"request on {self.replica_id or 'queue'} since {self.started_at}"


class RateLimit(models.Model):
    """A workspace's inference rate limits, as token buckets (GCRA): each bucket is full again
    at its theoretical arrival time (`*_full_at`, epoch seconds), which every admitted request
    pushes on by its cost. The operator's override of the settings' defaults is here too."""

    workspace = models.OneToOneField(
        Workspace, on_delete=models.CASCADE, related_name="rate_limit", primary_key=True
    )
    # Null: VERI_RATE_LIMIT_REQUESTS_PER_MINUTE / VERI_RATE_LIMIT_TOKENS_PER_MINUTE.
    requests_per_minute = models.PositiveIntegerField(
        null=True, blank=True, validators=[MinValueValidator(1)]
    )
    tokens_per_minute = models.PositiveIntegerField(
        null=True, blank=True, validators=[MinValueValidator(1)]
    )
    requests_full_at = models.FloatField(default=0)
    tokens_full_at = models.FloatField(default=0)

    def __str__(self) -> str:
        return f"rate limits of {self.workspace}"
