"""The OpenAI face's own records: a file (a Veri dataset underneath, or stored bytes for
purposes that do not train) and a fine-tuning job (the Veri training jobs it ran, in order: a
pause ends one, a resume starts the next from its newest checkpoint)."""

import secrets

from django.db import models

from training.models import Dataset, TrainingJob
from veri.models import ID_ALPHABET, Workspace


def openai_id(prefix: str) -> str:
    """OpenAI-shaped ids (`file-…`, `ftjob-…`): 24 random base-36 characters."""
    return f"{prefix}-" + "".join(secrets.choice(ID_ALPHABET) for _ in range(24))


def file_id() -> str:
    return openai_id("file")


def fine_tuning_job_id() -> str:
    return openai_id("ftjob")


class File(models.Model):
    class Purpose(models.TextChoices):
        FINE_TUNE = "fine-tune"
        FINE_TUNE_RESULTS = "fine-tune-results"
        EVALS = "evals"
        USER_DATA = "user_data"

    public_id = models.CharField(max_length=40, unique=True, editable=False, default=file_id)
    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="openai_files")
    purpose = models.CharField(max_length=20, choices=Purpose.choices)
    filename = models.CharField(max_length=255)
    bytes = models.PositiveBigIntegerField()
    # fine-tune: the Veri dataset the file is; other purposes keep their bytes at `object_key`.
    dataset = models.ForeignKey(
        Dataset, on_delete=models.PROTECT, null=True, blank=True, related_name="openai_files"
    )
    object_key = models.CharField(max_length=1024, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes = [models.Index(fields=["workspace", "-id"])]

    def __str__(self) -> str:
        return f"{self.public_id} ({self.purpose})"


class FineTuningJob(models.Model):
    public_id = models.CharField(
        max_length=40, unique=True, editable=False, default=fine_tuning_job_id
    )
    workspace = models.ForeignKey(
        Workspace, on_delete=models.CASCADE, related_name="fine_tuning_jobs"
    )
    model = models.CharField(max_length=1100)  # as the client named it
    method = models.JSONField()  # {"type", <type>: {"hyperparameters": {...}, "grader"?}}
    # The files' ids as given: deleting a file later leaves the job's record as it was (its
    # data is the Veri job's dataset).
    training_file = models.CharField(max_length=40)
    validation_file = models.CharField(max_length=40, blank=True)
    suffix = models.CharField(max_length=64, blank=True)
    seed = models.BigIntegerField()
    metadata = models.JSONField(null=True, blank=True)
    integrations = models.JSONField(default=list, blank=True)
    # The Veri job running it now (or the last one), and the ones a pause ended, oldest first.
    job = models.OneToOneField(TrainingJob, on_delete=models.PROTECT, related_name="fine_tuning")
    earlier_jobs = models.ManyToManyField(TrainingJob, related_name="+", blank=True)
    paused = models.BooleanField(default=False)
    # `DELETE /v1/models/<ft:…>`: the model is no longer listed nor found by name; the Veri job
    # and its files stay as the job's record.
    model_deleted = models.BooleanField(default=False)
    result_file = models.ForeignKey(
        File, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    warnings = models.JSONField(default=list, blank=True)  # options taken but ignored
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes = [models.Index(fields=["workspace", "-id"])]

    def __str__(self) -> str:
        return self.public_id
