from django.db import models

from veri.models import Workspace, public_id_field
from volumes.models import Volume
from volumes.stores import keys


class Dataset(models.Model):
    class Source(models.TextChoices):
        UPLOAD = "upload"
        HF = "hf"
        VOLUME = "volume"

    public_id = public_id_field("ds")
    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="datasets")
    source = models.CharField(max_length=10, choices=Source.choices)
    name = models.CharField(max_length=200, blank=True)
    # upload
    object_key = models.CharField(max_length=1024, blank=True)
    # The upload's sha256: the same bytes uploaded again are this dataset (one row per workspace).
    # Empty on rows from before it was kept; those are never matched.
    content_sha256 = models.CharField(max_length=64, blank=True)
    size_bytes = models.PositiveBigIntegerField(null=True)
    row_count = models.PositiveIntegerField(null=True)
    # The first line that does not fit each method ({"dpo": 3, ...}; absent: every line fits),
    # worked out once at upload so submit need not read the file again.
    first_bad_line = models.JSONField(default=dict, blank=True)
    # hf
    hf_repo = models.CharField(max_length=300, blank=True)
    hf_split = models.CharField(max_length=100, blank=True)
    hf_revision = models.CharField(max_length=200, blank=True)
    # volume
    volume = models.ForeignKey(
        Volume, on_delete=models.SET_NULL, null=True, blank=True, related_name="datasets"
    )
    volume_name = models.CharField(max_length=128, blank=True)
    path = models.CharField(max_length=1024, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["workspace", "content_sha256"],
                condition=models.Q(source="upload") & ~models.Q(content_sha256=""),
                name="one_upload_per_content",
            )
        ]

    def __str__(self) -> str:
        return f"{self.public_id} ({self.source})"


class JobStatus(models.TextChoices):
    QUEUED = "queued"
    PROVISIONING = "provisioning"
    CONFIGURING = "configuring"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


TERMINAL = {JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.CANCELLED}


class TrainingJob(models.Model):
    public_id = public_id_field("job")
    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="training_jobs")
    status = models.CharField(
        max_length=20, choices=JobStatus.choices, default=JobStatus.QUEUED, db_index=True
    )
    method = models.CharField(max_length=20)
    base_model = models.CharField(max_length=1100)  # volume://<128>/<900>, a hub id, a folder
    dataset = models.ForeignKey(Dataset, on_delete=models.PROTECT, related_name="jobs")
    # Evaluated on every `eval_interval` steps (eval_loss…); never trained on.
    validation_dataset = models.ForeignKey(
        Dataset, on_delete=models.PROTECT, null=True, blank=True, related_name="validated_jobs"
    )
    reward_source = models.TextField(blank=True)
    output_name = models.CharField(max_length=200, blank=True)
    hyperparameters = models.JSONField(default=dict, blank=True)
    lora = models.JSONField(default=dict, blank=True)
    volumes = models.JSONField(default=list, blank=True)  # [{"id", "name"}]
    # [{"type": "wandb", "wandb": {project, name, entity, tags}}] (training.services.integrations)
    integrations = models.JSONField(default=list, blank=True)
    resume_from = models.ForeignKey(
        "Checkpoint", on_delete=models.SET_NULL, null=True, blank=True, related_name="resumed_by"
    )
    # A fine-tuned model's adapter the job trains on from (its base is `base_model`), with a new
    # optimizer at step 0; `resume_from` instead continues a run where it stopped.
    adapter_from = models.ForeignKey(
        "Checkpoint", on_delete=models.SET_NULL, null=True, blank=True, related_name="trained_on"
    )
    provider = models.CharField(max_length=30)
    region = models.CharField(max_length=40)
    gpu_type = models.CharField(max_length=60)
    gpu_count = models.PositiveSmallIntegerField(default=1)
    checkpoint_every = models.PositiveIntegerField(null=True, blank=True)
    checkpoint_keep = models.PositiveIntegerField(default=2)
    heartbeat_timeout_seconds = models.PositiveIntegerField(default=300)
    max_launch_attempts = models.PositiveSmallIntegerField(default=3)
    max_cost_micros = models.PositiveBigIntegerField(null=True, blank=True)  # the budget cap
    # A platform fault after launch restarts the job from its newest checkpoint, this many times.
    auto_resume = models.BooleanField(default=True)
    max_restarts = models.PositiveSmallIntegerField(default=3)
    attempt = models.PositiveSmallIntegerField(default=1)  # the run now going (1: never restarted)
    earlier_kept_micros = models.PositiveBigIntegerField(default=0)  # restarted runs' kept compute
    # The sha256 of the mounted volumes' files as pinned at submit (empty: submitted before pins,
    # whose runs read the volumes as they are).
    inputs_digest = models.CharField(max_length=64, blank=True)
    # A stop the control plane asked of the worker (budget reached, balance exhausted): the
    # worker saves a checkpoint and ends with this code; past a grace period the watchdog ends it.
    stop_code = models.CharField(max_length=40, blank=True)
    stop_message = models.TextField(blank=True)
    stop_requested_at = models.DateTimeField(null=True, blank=True)
    # Where the current run's worker is (`training.errors.PHASES`), as its runner reported: a
    # platform fault is believed only from the phase whose check finds it.
    worker_phase = models.CharField(max_length=16, blank=True)
    # When the current run entered the start-up phases only the worker sees, and its first
    # checkpoint, on the control plane's clock (`training.services.timings`); never read for
    # money or fault attribution.
    timings = models.JSONField(default=dict, blank=True)

    last_step = models.PositiveIntegerField(null=True, blank=True)
    last_step_at = models.DateTimeField(null=True, blank=True)  # when last_step last went up
    # Steps recorded and each metric's first and last value, kept as points arrive (lists of jobs
    # show it without reading every point).
    metrics_summary = models.JSONField(null=True, blank=True)
    last_heartbeat_at = models.DateTimeField(null=True, blank=True)
    error_code = models.CharField(max_length=40, blank=True)
    error_message = models.TextField(blank=True)
    error_attribution = models.CharField(max_length=20, blank=True)

    created_at = models.DateTimeField(auto_now_add=True)
    launch_claimed_at = models.DateTimeField(null=True, blank=True)  # a provision task has it
    # Renewed by that task while the provider call runs: a slow launch is told from a dead one.
    launch_heartbeat_at = models.DateTimeField(null=True, blank=True)
    provisioning_at = models.DateTimeField(null=True, blank=True)
    configuring_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)  # reached running
    finished_at = models.DateTimeField(null=True, blank=True)
    cost_waived = models.BooleanField(default=False)  # cancelled before running
    # What the job cost and when it was charged are billing's (`billing.JobBilling`).
    # The settle task's last step done (money included): until then the watchdog re-queues it.
    settled_at = models.DateTimeField(null=True, blank=True)
    log_archived_at = models.DateTimeField(null=True, blank=True)
    log_archived_seq = models.BigIntegerField(null=True, blank=True)
    # The log kept so far, in UTF-8 bytes with a newline per line (VERI_MAX_LOG_BYTES caps it),
    # and when it reached the cap: later lines are dropped.
    log_bytes = models.PositiveBigIntegerField(default=0)
    log_truncated_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [
            models.Index(fields=["workspace", "-id"]),
            # The watchdog's look for ended jobs whose settle task was lost: a handful of rows.
            models.Index(
                fields=["finished_at"],
                condition=models.Q(finished_at__isnull=False, settled_at__isnull=True),
                name="training_job_unsettled",
            ),
        ]

    def __str__(self) -> str:
        return self.public_id

    @property
    def is_terminal(self) -> bool:
        return self.status in TERMINAL

    @property
    def samples_every(self) -> int:
        """GRPO: the worker sends sampled completions every this many steps (about 20 times)."""
        return max(1, self.hyperparameters.get("max_steps", 200) // 20)

    @property
    def pin_holder(self) -> str:
        """Whose pins the job's mounted files are (`volumes.PinnedFile.holder`)."""
        return f"job:{self.public_id}"

    @property
    def workspace_prefix(self) -> keys.Prefix:
        return keys.workspace_prefix(self.workspace.public_id)

    @property
    def output_prefix(self) -> keys.Prefix:
        """Everything the job writes (checkpoints, the final model, its log) is under it."""
        return keys.job_prefix(self.workspace.public_id, self.public_id)

    @property
    def log_key(self) -> str:
        return keys.job_log_key(self.output_prefix)


class JobEvent(models.Model):
    job = models.ForeignKey(TrainingJob, on_delete=models.CASCADE, related_name="events")
    type = models.CharField(max_length=40)
    at = models.DateTimeField(auto_now_add=True)
    detail = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["pk"]

    def __str__(self) -> str:
        return f"{self.job_id} {self.type}"


class JobAttempt(models.Model):
    """A run of a job that a platform fault ended and Veri restarted: its machine, its times, and
    its compute split into kept (up to its last checkpoint, charged) and lost (after it,
    credited back). The run going now is the job's `instance`."""

    job = models.ForeignKey(TrainingJob, on_delete=models.CASCADE, related_name="attempts")
    number = models.PositiveSmallIntegerField()
    cause = models.CharField(max_length=40)  # the fault's catalog code
    message = models.TextField(blank=True)
    provider = models.CharField(max_length=30)
    instance_id = models.CharField(max_length=200, blank=True)
    gpu_type = models.CharField(max_length=60)
    gpu_count = models.PositiveSmallIntegerField()
    price_per_hour_micros = models.PositiveBigIntegerField()
    launched_at = models.DateTimeField(null=True)
    ended_at = models.DateTimeField()
    from_step = models.PositiveIntegerField(default=0)  # the checkpoint it started from
    checkpoint_step = models.PositiveIntegerField(null=True)  # its last checkpoint, if any
    checkpoint_at = models.DateTimeField(null=True)
    kept_micros = models.PositiveBigIntegerField(default=0)
    lost_micros = models.PositiveBigIntegerField(default=0)

    class Meta:
        ordering = ["number"]
        constraints = [
            models.UniqueConstraint(fields=["job", "number"], name="one_row_per_attempt")
        ]

    def __str__(self) -> str:
        return f"{self.job_id} attempt {self.number} ({self.cause})"


MAX_SEQ = 2**63 - 1  # a log line's number is a 64-bit column


class LogChunk(models.Model):
    """One line of the worker's stdout/stderr, numbered by the worker; a resent line is ignored."""

    job = models.ForeignKey(TrainingJob, on_delete=models.CASCADE, related_name="log_chunks")
    seq = models.BigIntegerField()
    at = models.DateTimeField()
    text = models.TextField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["job", "seq"], name="one_line_per_seq")]

    def __str__(self) -> str:
        return f"{self.job_id}#{self.seq}"


class MetricPoint(models.Model):
    job = models.ForeignKey(TrainingJob, on_delete=models.CASCADE, related_name="metric_points")
    step = models.PositiveIntegerField()
    at = models.DateTimeField()
    values = models.JSONField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["job", "step"], name="one_point_per_step")]

    def __str__(self) -> str:
        return f"{self.job_id}@{self.step}"


class Sample(models.Model):
    """A GRPO completion the worker sent with its reward, every few steps (the Samples tab)."""

    job = models.ForeignKey(TrainingJob, on_delete=models.CASCADE, related_name="samples")
    step = models.PositiveIntegerField()
    index = models.PositiveSmallIntegerField()
    prompt = models.TextField()
    completion = models.TextField()
    reward = models.FloatField()
    rewards = models.JSONField(default=dict)  # each reward function's score
    at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["job", "step", "index"], name="one_sample_per_slot")
        ]

    def __str__(self) -> str:
        return f"{self.job_id}@{self.step}#{self.index}"


class Checkpoint(models.Model):
    """A LoRA adapter (and, for a job's, the trainer's state) in the store: a job's, under its
    output prefix, or one saved by a face above training without a job (a Tinker `save_state`),
    which names its own base model and folder."""

    public_id = public_id_field("ckpt")
    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="checkpoints")
    job = models.ForeignKey(
        TrainingJob, on_delete=models.CASCADE, null=True, blank=True, related_name="checkpoints"
    )
    # Without a job: the model it was trained on, and its folder under the workspace's prefix.
    base_model = models.CharField(max_length=1100, blank=True)
    folder = models.CharField(max_length=200, blank=True)
    step = models.PositiveIntegerField()
    final = models.BooleanField(default=False)
    files = models.JSONField(default=list)  # [{"path", "size"}], paths relative to `prefix`
    size_bytes = models.PositiveBigIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["job", "step", "final"], name="one_checkpoint_per_step"
            ),
            models.CheckConstraint(
                condition=models.Q(job__isnull=False)
                | (~models.Q(base_model="") & ~models.Q(folder="")),
                name="checkpoint_without_job_names_its_base_and_folder",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.public_id} ({self.job_id or self.folder} step {self.step})"

    @property
    def prefix(self) -> keys.Prefix:
        if self.job is None:
            return keys.workspace_prefix(self.workspace.public_id).child(self.folder)
        return keys.checkpoint_prefix(self.job.output_prefix, step=self.step, final=self.final)

    @property
    def adapter_base(self) -> str:
        """The base model the adapter was trained on."""
        return self.job.base_model if self.job else self.base_model

    def file_keys(self) -> list[tuple[dict, str]]:
        """Each listed file with its object key (a stored path that breaks the rules is refused
        by `keys`, never turned into a key)."""
        return [(f, self.prefix.key(f["path"])) for f in self.files]


class WatchdogState(models.Model):
    """The one row behind the watchdog's tick chain: which run of it is current, and when it
    last ticked, archived logs and swept for orphaned machines (see `training.tasks.watch_tick`)."""

    run = models.CharField(max_length=32, blank=True)
    last_tick_at = models.DateTimeField(null=True)
    last_archive_at = models.DateTimeField(null=True)
    last_sweep_at = models.DateTimeField(null=True)  # providers' orphaned machines
    last_resettle_at = models.DateTimeField(null=True)  # ended jobs whose settle task was lost
    # When ticks came back after a silence (the task cluster down, or the platform restarted):
    # a worker's silence before then is no evidence against it.
    resumed_at = models.DateTimeField(null=True)

    def __str__(self) -> str:
        return f"watchdog run {self.run or '-'} at {self.last_tick_at}"


class JobToken(models.Model):
    """The worker's credential: one job's worker endpoints only, until `expires_at`, and dead
    once the job is terminal. A job holds one, or two for a few minutes after its runner renewed
    (the one it renewed with keeps working for requests in flight); a relaunch replaces all."""

    job = models.ForeignKey(TrainingJob, on_delete=models.CASCADE, related_name="tokens")
    token_hash = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField()

    def __str__(self) -> str:
        return f"token of {self.job_id}"
