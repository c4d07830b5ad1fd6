"""Jobs that outlive the platform: a platform fault after the machine launched (the catalog's
`restarts` codes) sends the job back to be launched again from its newest checkpoint, up to
`max_restarts` times, instead of ending it. Each ended run is kept as a `JobAttempt` with its
compute split at its last checkpoint: what came before is kept (charged), what came after is
lost (credited back when the job settles)."""

from django.db import transaction
from django.utils import timezone

from providers import services as provider_services
from providers.models import Instance
from providers.services import get_adapter
from training import errors, hooks
from training.models import (
    Checkpoint,
    JobAttempt,
    JobEvent,
    JobStatus,
    JobToken,
    MetricPoint,
    TrainingJob,
)
from training.services import jobs, timings
from veri.queue import enqueue_on_commit

S = JobStatus
LAUNCHED = {S.PROVISIONING, S.CONFIGURING, S.RUNNING}


def fail_or_restart(
    *, job_id: int, code: str, message: str = "", detail: dict | None = None
) -> TrainingJob:
    """End the job with `code`, or, when the fault is the platform's, the job asked for it
    (`auto_resume`), has restarts left and no stop was asked, restart it. Raises
    InvalidTransition as `fail_job` does when the job has already ended."""
    with transaction.atomic():
        job = TrainingJob.objects.select_for_update().get(pk=job_id)
        instance = Instance.objects.filter(job=job).first()
        if not _restartable(job, code, instance):
            return jobs.fail_job(job_id=job_id, code=code, message=message, detail=detail)
        machine = (instance.provider, instance.external_id)
        job = _restart(job, instance, code=code, message=message)
    if machine[1]:  # after the commit: a provider call never holds the job's row
        get_adapter(machine[0]).terminate(machine[1])
    return job


def _restartable(job: TrainingJob, code: str, instance: Instance | None) -> bool:
    return (
        errors.get(code).restarts
        and job.auto_resume
        and job.attempt <= job.max_restarts
        and job.status in LAUNCHED
        and not job.stop_code
        and instance is not None
        and instance.launched_at is not None
    )


def _restart(job: TrainingJob, instance: Instance, *, code: str, message: str) -> TrainingJob:
    now = timezone.now()
    newest = Checkpoint.objects.filter(job=job, final=False).order_by("-step").first()
    saved_in_run = newest if newest and newest.created_at >= instance.launched_at else None
    checkpoint_at = saved_in_run.created_at if saved_in_run else None
    kept, lost = hooks.money().split_run(
        price_per_hour_micros=instance.price_per_hour_micros,
        launched_at=instance.launched_at,
        ended_at=now,
        checkpoint_at=checkpoint_at,
    )
    attempt = JobAttempt.objects.create(
        job=job,
        number=job.attempt,
        cause=code,
        message=message or errors.get(code).cause,
        provider=instance.provider,
        instance_id=instance.external_id,
        gpu_type=instance.gpu_type,
        gpu_count=instance.gpu_count,
        price_per_hour_micros=instance.price_per_hour_micros,
        launched_at=instance.launched_at,
        ended_at=now,
        from_step=job.resume_from.step if job.resume_from else 0,
        checkpoint_step=saved_in_run.step if saved_in_run else None,
        checkpoint_at=checkpoint_at,
        kept_micros=kept,
        lost_micros=lost,
    )
    provider_services.discard_instance(instance=instance)
    JobToken.objects.filter(job=job).delete()  # the ended run's worker can report nothing more
    job.status = S.QUEUED
    job.attempt += 1
    job.earlier_kept_micros += kept
    job.resume_from = newest or job.resume_from
    job.launch_claimed_at = job.launch_heartbeat_at = None
    job.provisioning_at = job.configuring_at = job.last_heartbeat_at = job.last_step_at = None
    job.worker_phase = ""  # the next run starts over
    timings.new_run(job)
    job.save()
    JobEvent.objects.create(
        job=job,
        type="job_restarted",
        detail={
            "cause": code,
            "message": attempt.message,
            "attempt": job.attempt,
            "from_step": job.resume_from.step if job.resume_from else 0,
            "lost_usd": f"{lost / 1_000_000:.6f}",
        },
    )
    enqueue_on_commit("training.tasks.provision_job", job_id=job.pk)
    return job


# A replayed step's value matches the earlier run's when within this much (absolute, relative).
REPLAY_ABS_TOLERANCE, REPLAY_REL_TOLERANCE = 1e-3, 1e-2
# What a replayed step must reproduce: its loss, and for GRPO, whose loss is near zero by
# construction, the reward of the completions it sampled (the restored RNG's proof).
REPLAYED_METRICS = ("loss", "reward")


def _number(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _matches(before: float, now: float) -> bool:
    return abs(now - before) <= REPLAY_ABS_TOLERANCE + REPLAY_REL_TOLERANCE * abs(before)


def verify_replay(*, job: TrainingJob, points: list[dict]) -> str | None:
    """A restarted run trains the step after its checkpoint again, which the earlier run also
    reported: the two must agree on each of REPLAYED_METRICS both reported, else the resume did
    not restore the model, optimizer, RNG or data position. One `resume_verified` or
    `resume_mismatch` event (with an alarm) per run; None until the replayed step arrives, or
    when the earlier run never reached it."""
    if job.attempt < 2 or not job.resume_from:
        return None
    step = job.resume_from.step + 1
    now = next((p["values"] for p in points if p["step"] == step), None)
    if now is None:
        return None
    before = MetricPoint.objects.filter(job=job, step=step).values_list("values", flat=True)
    before = before.first() or {}
    compared = [m for m in REPLAYED_METRICS if _number(now.get(m)) and _number(before.get(m))]
    if not compared:
        return None
    if JobEvent.objects.filter(
        job=job, type__in=["resume_verified", "resume_mismatch"], detail__attempt=job.attempt
    ).exists():
        return None
    differing = [m for m in compared if not _matches(before[m], now[m])]
    kind = "resume_mismatch" if differing else "resume_verified"
    detail = {"attempt": job.attempt, "step": step}
    for metric in compared:
        detail |= {f"{metric}_before": before[metric], f"{metric}_now": now[metric]}
    JobEvent.objects.create(job=job, type=kind, detail=detail)
    if differing:
        what = ", ".join(f"{m} {now[m]:.6g} (was {before[m]:.6g})" for m in differing)
        JobEvent.objects.create(
            job=job,
            type="alarm_resume_mismatch",
            detail=detail
            | {
                "message": f"After the restart, step {step} trained to {what}: the resumed run "
                "is not the same training."
            },
        )
    return kind
