"""Tinker keys, sessions, training models (each one worker process) and the operations queued
for them in order. A model's machine uptime is charged per second (`charged_until` is where its
charges stopped), within its session's budget cap."""

from django.db import models

from training.models import Checkpoint
from veri.models import Workspace, public_id_field


class TinkerKey(models.Model):
    """`tml-<prefix>_<secret>`, the credential the `tinker` client sends (`X-API-Key`): the prefix
    finds the row, only the secret's hash is kept, as for API keys."""

    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="tinker_keys")
    public_id = public_id_field("tk")
    name = models.CharField(max_length=100, blank=True)
    prefix = models.CharField(max_length=16, unique=True, editable=False)
    secret_hash = models.CharField(max_length=64, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True, editable=False)
    revoked_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"tml-{self.prefix}_…"


class TinkerSession(models.Model):
    """A `ServiceClient`: alive while the client heartbeats."""

    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE)
    public_id = public_id_field("tses")
    sdk_version = models.CharField(max_length=40, blank=True)
    tags = models.JSONField(default=list)
    user_metadata = models.JSONField(default=dict)
    created_at = models.DateTimeField(auto_now_add=True)
    last_heartbeat_at = models.DateTimeField()
    ended_at = models.DateTimeField(null=True, blank=True)
    # What its models' uptime may cost in all (`veri_max_cost_usd` in the client's metadata, else
    # VERI_TINKER_SESSION_MAX_COST_USD); reaching it saves and ends them.
    max_cost_micros = models.BigIntegerField(default=0)

    def __str__(self) -> str:
        return self.public_id


class ModelStatus(models.TextChoices):
    STARTING = "starting"  # written; its worker is being launched or is loading the model
    READY = "ready"  # the worker runs operations
    SAVING = "saving"  # ending: the worker saves its state first (`error_code` says why)
    FAILED = "failed"
    ENDED = "ended"


MODEL_LIVE = (ModelStatus.STARTING, ModelStatus.READY, ModelStatus.SAVING)


# A sampling-only model's model_seq_id: past those a client may give its training clients.
SAMPLER_SEQ = 10_001


class TinkerModel(models.Model):
    """A `TrainingClient`'s model: a base model with a LoRA and an AdamW optimizer, held by one
    long-lived worker process on a machine from a provider. `model_id` is the client's id,
    `<session>:train:<seq>`, as the client itself derives it."""

    session = models.ForeignKey(TinkerSession, on_delete=models.CASCADE, related_name="models")
    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE)
    model_id = models.CharField(max_length=80, unique=True)
    model_seq_id = models.PositiveIntegerField()
    base_model = models.CharField(max_length=300)
    lora = models.JSONField()  # rank, seed, train_mlp, train_attn, train_unembed
    user_metadata = models.JSONField(default=dict)
    status = models.CharField(max_length=16, choices=ModelStatus, default=ModelStatus.STARTING)
    error_code = models.CharField(max_length=64, blank=True)
    error_message = models.TextField(blank=True)
    provider = models.CharField(max_length=32)
    gpu_type = models.CharField(max_length=64)
    external_id = models.CharField(max_length=200, blank=True)  # the provider's machine
    price_per_hour_micros = models.BigIntegerField(default=0)  # the catalog's, at creation
    launched_at = models.DateTimeField(null=True, blank=True)  # its machine's uptime starts
    charged_until = models.DateTimeField(null=True, blank=True)
    charged_micros = models.BigIntegerField(default=0)
    token_hash = models.CharField(max_length=64, blank=True, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    ready_at = models.DateTimeField(null=True, blank=True)
    last_seen_at = models.DateTimeField(null=True, blank=True)  # the worker's last poll
    ended_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["session", "model_seq_id"], name="one_model_per_seq")
        ]

    def __str__(self) -> str:
        return self.model_id

    @property
    def samples_only(self) -> bool:
        """A sampling-only model (tinker_api.services.sampling): nothing trains it."""
        return self.model_seq_id >= SAMPLER_SEQ


class OpKind(models.TextChoices):
    CREATE = "create_model"
    FORWARD_BACKWARD = "forward_backward"
    FORWARD = "forward"
    OPTIM_STEP = "optim_step"
    SAVE_WEIGHTS = "save_weights"
    LOAD_WEIGHTS = "load_weights"
    SAVE_FOR_SAMPLER = "save_weights_for_sampler"  # the weights its samplers sample with
    SAMPLE = "sample"  # not in the client's order: seq_id is its sampler's save


class OpStatus(models.TextChoices):
    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"


class TinkerOperation(models.Model):
    """One request of a model, run by its worker in `seq_id` order (the client numbers them; a
    retried request with the same number is the same operation). Its `request_id` is the
    client's future. A sample is numbered by its sampling client, not the model: its `seq_id` is
    the `save_weights_for_sampler` whose weights it uses, and it runs once that one has."""

    model = models.ForeignKey(TinkerModel, on_delete=models.CASCADE, related_name="operations")
    request_id = public_id_field("treq")
    seq_id = models.PositiveIntegerField()
    kind = models.CharField(max_length=32, choices=OpKind)
    payload = models.JSONField(default=dict)
    status = models.CharField(max_length=16, choices=OpStatus, default=OpStatus.QUEUED)
    result = models.JSONField(null=True, blank=True)
    error = models.TextField(blank=True)
    error_category = models.CharField(max_length=16, blank=True)  # user | server
    tokens = models.PositiveIntegerField(default=0)  # a forward(_backward)'s input tokens
    # A sample asked with record_stability_info: until when stable_reinforce may train on its
    # sequences (tinker_api.services.stability).
    recorded_until = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["model", "seq_id"],
                condition=~models.Q(kind="sample"),
                name="one_operation_per_seq",
            )
        ]

    def __str__(self) -> str:
        return f"{self.model_id}#{self.seq_id} {self.kind}"

    @property
    def uploads(self) -> bool:
        """Its worker uploads files (a checkpoint's): a `save_state`, or a named sampler save."""
        return self.kind == OpKind.SAVE_WEIGHTS or (
            self.kind == OpKind.SAVE_FOR_SAMPLER and bool(self.payload.get("name"))
        )


class CheckpointKind(models.TextChoices):
    """The segment of a save's `tinker://` path."""

    STATE = "weights", "state"  # save_state: LoRA weights and AdamW state
    SAMPLER = "sampler_weights", "sampler weights"  # a named save_weights_for_sampler: LoRA only


class TinkerCheckpoint(models.Model):
    """A model's save, addressed by the client as `tinker://<model_id>/<kind>/<name>`: a
    `save_state` (LoRA weights and AdamW state) or a named `save_weights_for_sampler` (its LoRA
    weights). Its files are under the workspace's `tinker/…/` folder (tinker_api.services.
    checkpoints.folder); `files` is set once they are all uploaded. Its LoRA adapter is then also
    a Veri checkpoint (`checkpoint`, without a job, on the same folder): deployments and managed
    jobs take it as they take a job's."""

    model = models.ForeignKey(TinkerModel, on_delete=models.CASCADE, related_name="checkpoints")
    kind = models.CharField(max_length=20, choices=CheckpointKind, default=CheckpointKind.STATE)
    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE)
    public_id = public_id_field("tck")
    operation = models.OneToOneField(TinkerOperation, on_delete=models.CASCADE)
    name = models.CharField(max_length=100)
    files = models.JSONField(null=True, blank=True)  # [{path, size}] once complete
    checkpoint = models.OneToOneField(
        Checkpoint, on_delete=models.SET_NULL, null=True, blank=True, related_name="tinker_save"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"{self.model.model_id}/{self.kind}/{self.name}"

    @property
    def size_bytes(self) -> int:
        return sum(f["size"] for f in self.files or [])
