import re

from django.db.models import Q, QuerySet

from openai_api.models import File, FineTuningJob
from openai_api.objects import FINE_TUNED_RE, EventItem
from training.models import Checkpoint, JobEvent, MetricPoint, TrainingJob
from veri.errors import NotFound, VeriError
from veri.models import Workspace


def list_files(*, workspace: Workspace, purpose: str | None = None) -> QuerySet[File]:
    files = File.objects.filter(workspace=workspace).select_related("workspace", "dataset")
    return files.filter(purpose=purpose) if purpose else files


def get_file(*, workspace: Workspace, file_id: str) -> File:
    found = list_files(workspace=workspace).filter(public_id=file_id).first()
    if found is None:
        raise NotFound(f"No such file: {file_id[:60]}", field="file_id")
    return found


# Billing's record and refund of the Veri job (reverse relations, named, not imported): the job
# object shows its money through `hooks.money().job_money` without a query per job.
JOB_RELATIONS = ("job", "job__billing", "job__refund", "workspace", "result_file")


def jobs_of(*, workspace: Workspace) -> QuerySet[FineTuningJob]:
    return FineTuningJob.objects.filter(workspace=workspace).select_related(*JOB_RELATIONS)


def list_jobs(*, workspace: Workspace, metadata: dict[str, str]) -> QuerySet[FineTuningJob]:
    jobs = jobs_of(workspace=workspace)
    # Containment, not a lookup per key: a key is the customer's data (`a__regex` is a key).
    return jobs.filter(metadata__contains=metadata) if metadata else jobs


def runs(*, ft: FineTuningJob) -> list[TrainingJob]:
    """The Veri jobs the fine-tuning job ran, oldest first (more than one after a resume)."""
    return [*ft.earlier_jobs.order_by("pk"), ft.job]


def checkpoints(*, ft: FineTuningJob) -> list[tuple[Checkpoint, dict]]:
    """Its saved checkpoints (the final model is `fine_tuned_model`), newest first, each with
    the metrics logged at its step."""
    jobs = runs(ft=ft)
    found = list(
        Checkpoint.objects.filter(job__in=jobs, final=False)
        .select_related("job")
        .order_by("-step", "-pk")
    )
    points = {
        (p.job_id, p.step): p.values
        for p in MetricPoint.objects.filter(job__in=jobs, step__in=[c.step for c in found])
    }
    return [(c, points.get((c.job_id, c.step), {})) for c in found]


EVENT_ID_RE = re.compile(r"ftevent-(?:w(?P<ft>\d+)x(?P<index>\d+)|e(?P<event>\d+)|m(?P<point>\d+))")


def _event_position(ft: FineTuningJob, jobs: list[TrainingJob], event_id: str) -> tuple:
    """Where an event id sits in the job's newest-first list: (time, kind, number)."""
    match = EVENT_ID_RE.fullmatch(event_id)
    found = None
    if match and match["index"] and int(match["ft"]) == ft.pk:
        if int(match["index"]) < len(ft.warnings):
            found = (ft.created_at, 0, int(match["index"]))
    elif match and match["event"]:
        at = JobEvent.objects.filter(job__in=jobs, pk=match["event"]).values_list("at").first()
        found = at and (at[0], 1, int(match["event"]))
    elif match and match["point"]:
        at = MetricPoint.objects.filter(job__in=jobs, pk=match["point"]).values_list("at").first()
        found = at and (at[0], 2, int(match["point"]))
    if not found:
        raise VeriError(f"after {event_id[:60]!r} is not an id of this list.", field="after")
    return found


def event_page(*, ft: FineTuningJob, after: str | None, limit: int) -> tuple[list[EventItem], bool]:
    """A page of the job's events, newest first, after the event `after` names, and whether
    more follow. Each source is read from the database a page at a time: a long run logs a
    metrics event per step, and a client paging through them must not rebuild them all for
    every page."""
    jobs = runs(ft=ft)
    cursor = _event_position(ft, jobs, after) if after else None
    found: list[tuple[tuple, EventItem]] = [
        ((ft.created_at, 0, index), index)
        for index in range(len(ft.warnings))
        if cursor is None or (ft.created_at, 0, index) < cursor
    ]
    for kind, rows in (
        (1, JobEvent.objects.filter(job__in=jobs)),
        (2, MetricPoint.objects.filter(job__in=jobs).select_related("job")),
    ):
        if cursor is not None:
            at, cursor_kind, number = cursor
            if kind == cursor_kind:
                rows = rows.filter(Q(at__lt=at) | Q(at=at, pk__lt=number))
            else:  # at one instant, a later kind comes first in the newest-first list
                rows = rows.filter(at__lt=at) if kind > cursor_kind else rows.filter(at__lte=at)
        found += [((row.at, kind, row.pk), row) for row in rows.order_by("-at", "-pk")[: limit + 1]]
    found.sort(key=lambda pair: pair[0], reverse=True)
    return [item for _, item in found[:limit]], len(found) > limit


def succeeded_jobs(*, workspace: Workspace) -> QuerySet[FineTuningJob]:
    return FineTuningJob.objects.filter(
        workspace=workspace, job__status="completed", model_deleted=False, paused=False
    ).select_related("job", "workspace")


def find_fine_tuned(*, workspace: Workspace, model: str) -> tuple[FineTuningJob, int | None] | None:
    """The succeeded fine-tuning job behind an `ft:…` name of this workspace, and the step its
    `:ckpt-step-<n>` names (None: the final model)."""
    match = FINE_TUNED_RE.fullmatch(model)
    if not match:
        return None
    found = succeeded_jobs(workspace=workspace).filter(public_id=f"ftjob-{match['id']}").first()
    if found is None:
        return None
    return found, int(match["step"]) if match["step"] else None


def get_fine_tuned(*, workspace: Workspace, model: str) -> FineTuningJob:
    """A fine-tuned model (not a checkpoint's name) of this workspace, or 404."""
    found = find_fine_tuned(workspace=workspace, model=model)
    if found is None or found[1] is not None:
        raise NotFound(f"The model `{model[:200]}` does not exist.", field="model")
    return found[0]
