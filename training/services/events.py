"""What another app records on a job through training, which owns its rows: an event in the
job's history, and an operator's change of a failure's attribution (billing's review queue)."""

from training.models import JobEvent, TrainingJob


def record_event(*, job_id: int, type: str, detail: dict) -> JobEvent:
    return JobEvent.objects.create(job_id=job_id, type=type, detail=detail)


def change_attribution(*, job_id: int, attribution: str, reason: str) -> None:
    """Set whose fault a failure was and record the change in the job's history; in the caller's
    transaction, which holds the job's row lock."""
    TrainingJob.objects.filter(pk=job_id).update(error_attribution=attribution)
    record_event(
        job_id=job_id,
        type="attribution_changed",
        detail={"attribution": attribution, "reason": reason},
    )
