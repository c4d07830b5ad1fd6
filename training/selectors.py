"""Reads of training objects, always within one workspace."""

from dataclasses import dataclass

from django.conf import settings
from django.db.models import Avg, Count, F, Max, Min, Q, QuerySet, Window
from django.db.models.functions import RowNumber

from training.models import (
    Checkpoint,
    Dataset,
    JobEvent,
    LogChunk,
    MetricPoint,
    Sample,
    TrainingJob,
)
from veri.errors import NotFound
from veri.models import Workspace
from volumes.stores import store_for


def list_datasets(*, workspace: Workspace) -> QuerySet[Dataset]:
    return Dataset.objects.filter(workspace=workspace)


def get_dataset(*, workspace: Workspace, dataset_id: str) -> Dataset:
    dataset = list_datasets(workspace=workspace).filter(public_id=dataset_id).first()
    if dataset is None:
        raise NotFound(f"No dataset {dataset_id!r} in this workspace.")
    return dataset


def list_jobs(*, workspace: Workspace) -> QuerySet[TrainingJob]:
    return (
        TrainingJob.objects.filter(workspace=workspace)
        # billing's record and refund (reverse relations, named, not imported): the API shows
        # a job's money through `hooks.money().job_money` without a query per job.
        .select_related(
            "workspace", "dataset", "validation_dataset", "resume_from", "billing", "refund"
        )
        # and the job's ledger entries (its charge and credits), one query for the whole list
        .prefetch_related("attempts", "ledgerentry_set")
    )


def get_job(*, workspace: Workspace, job_id: str) -> TrainingJob:
    job = list_jobs(workspace=workspace).filter(public_id=job_id).first()
    if job is None:
        raise NotFound(f"No training job {job_id!r} in this workspace.")
    return job


def log_lines_after(*, job: TrainingJob, after: int, limit: int) -> list[LogChunk]:
    return list(LogChunk.objects.filter(job=job, seq__gt=after).order_by("seq")[:limit])


def list_events(*, job: TrainingJob) -> QuerySet[JobEvent]:
    return JobEvent.objects.filter(job=job)


def list_metrics(*, job: TrainingJob) -> QuerySet[MetricPoint]:
    return MetricPoint.objects.filter(job=job)


def recent_metric_steps(*, jobs: list[TrainingJob], limit: int) -> dict[int, list[tuple]]:
    """Each job's newest `limit` metric points as (step, arrived at), by job pk, in one query
    (the progress of a page of jobs)."""
    numbered = MetricPoint.objects.filter(job__in=jobs).annotate(
        n=Window(RowNumber(), partition_by=[F("job_id")], order_by=F("step").desc())
    )
    recent: dict[int, list[tuple]] = {job.pk: [] for job in jobs}
    for job_id, step, at in numbered.filter(n__lte=limit).values_list("job_id", "step", "at"):
        recent[job_id].append((step, at))
    return recent


def list_samples(*, job: TrainingJob) -> QuerySet[Sample]:
    return Sample.objects.filter(job=job)


# How sample groups may be ordered: newest or oldest step, highest or lowest mean reward.
SAMPLE_ORDERS = {
    "-step": ("-step", "first_index"),
    "step": ("step", "first_index"),
    "-reward": ("-mean_reward", "-step", "first_index"),
    "reward": ("mean_reward", "-step", "first_index"),
}


@dataclass(frozen=True)
class SampleGroups:
    """A job's samples, filtered, as groups of one step's rollouts of one prompt."""

    groups: QuerySet  # {step, prompt, rollouts, mean_reward, best_reward, first_index}, ordered
    samples: QuerySet[Sample]  # the filtered rollouts the groups are made of

    def rollouts_of(self, groups: list[dict]) -> dict[tuple[int, str], list[Sample]]:
        """Each given group's rollouts, best reward first."""
        if not groups:
            return {}
        match = Q()
        for group in groups:
            match |= Q(step=group["step"], prompt=group["prompt"])
        found: dict[tuple[int, str], list[Sample]] = {}
        for sample in self.samples.filter(match).order_by("-reward", "index"):
            found.setdefault((sample.step, sample.prompt), []).append(sample)
        return found


def sample_groups(
    *,
    job: TrainingJob,
    step: int | None = None,
    min_reward: float | None = None,
    max_reward: float | None = None,
    order: str = "-step",
) -> SampleGroups:
    """The job's rollouts within the filters, grouped by (step, prompt): a GRPO step samples each
    prompt several times, and those rollouts are read together."""
    samples = list_samples(job=job)
    if step is not None:
        samples = samples.filter(step=step)
    if min_reward is not None:
        samples = samples.filter(reward__gte=min_reward)
    if max_reward is not None:
        samples = samples.filter(reward__lte=max_reward)
    groups = (
        samples.values("step", "prompt")
        .annotate(
            rollouts=Count("pk"),
            mean_reward=Avg("reward"),
            best_reward=Max("reward"),
            first_index=Min("index"),
        )
        .order_by(*SAMPLE_ORDERS.get(order, SAMPLE_ORDERS["-step"]))
    )
    return SampleGroups(groups=groups, samples=samples)


def sampled_steps(*, job: TrainingJob) -> list[int]:
    return list(list_samples(job=job).values_list("step", flat=True).distinct().order_by("step"))


def list_checkpoints(*, job: TrainingJob) -> QuerySet[Checkpoint]:
    return Checkpoint.objects.filter(job=job).select_related("job__workspace", "workspace")


def checkpoint_files(*, checkpoint: Checkpoint, only: str | None = None) -> list[dict]:
    """The checkpoint's files with a download URL signed now (relative for the local store), or
    only the file at path `only`."""
    store = store_for(checkpoint.prefix)
    ttl = settings.VERI_PRESIGN_TTL_SECONDS
    return [
        {
            "path": f["path"],
            "size": f["size"],
            "sha256": f.get("sha256", ""),
            "url": store.presign_get(key, expires=ttl),
        }
        for f, key in checkpoint.file_keys()
        if only is None or f["path"] == only
    ]
