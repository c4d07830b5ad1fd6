"""django-q2 tasks for training jobs: launching, watchdogs, settling, log archiving.
Each is idempotent and safe when two runs overlap."""

import contextlib
import logging
import time
import uuid
from collections import defaultdict
from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import F, Q
from django.utils import timezone
from django_q.tasks import async_task

from providers.services import machine_states
from training.models import JobStatus, TrainingJob, WatchdogState
from training.services import jobs, logs, provisioning, restarts, stops, watchdog

log = logging.getLogger(__name__)
S = JobStatus
ACTIVE = [S.QUEUED, S.PROVISIONING, S.CONFIGURING, S.RUNNING]


def provision_job(*, job_id: int) -> str:
    outcome = provisioning.launch_job(job_id=job_id)
    job = TrainingJob.objects.filter(pk=job_id).values("public_id", "provider", "gpu_type").first()
    if job:
        log.info("launch of %s on %s (%s): %s", *job.values(), outcome)
    return outcome


def settle_job(*, job_id: int) -> None:
    """Settle an ended job (see `jobs.settle_job`), then give a freed slot to the next queued
    job."""
    if jobs.settle_job(job_id=job_id):
        job = TrainingJob.objects.values("public_id", "status", "error_code").get(pk=job_id)
        why = f" ({job['error_code']})" if job["error_code"] else ""
        log.info("settled %s: %s%s", job["public_id"], job["status"], why)
        _enqueue_waiting()


def _enqueue_waiting(limit: int = 20) -> None:
    waiting = TrainingJob.objects.filter(status=S.QUEUED, launch_claimed_at__isnull=True)
    for job_id in waiting.order_by("pk").values_list("pk", flat=True)[:limit]:
        async_task("training.tasks.provision_job", job_id=job_id)


def check_jobs(*, now: datetime | None = None) -> dict[str, int]:
    """One watchdog tick over every active job: a fixed number of queries however many jobs
    there are (plus a few per job it fails), and one provider call per provider."""
    now = now or timezone.now()
    active = list(TrainingJob.objects.filter(status__in=ACTIVE).select_related("instance"))
    instances_by_provider = defaultdict(list)
    for job in active:
        instance = getattr(job, "instance", None)
        if instance and instance.external_id and instance.terminated_at is None:
            instances_by_provider[instance.provider].append(instance.external_id)
    states = machine_states(instances_by_provider)
    watched_since = WatchdogState.objects.values_list("resumed_at", flat=True).first()
    failed: dict[str, int] = defaultdict(int)
    still_active = []
    for job in active:
        if _obtained(job, states):
            with contextlib.suppress(jobs.InvalidTransition):  # it moved on meanwhile
                jobs.machine_obtained(job=job)
            continue
        fault = watchdog.verdict(job=job, states=states, now=now, watched_since=watched_since)
        if not fault and provisioning.launch_stalled(job, now=now):
            provisioning.recover_stalled_launch(job=job)
            continue
        if not fault:
            still_active.append(job)
            continue
        code, message, restart = fault
        try:
            if restart:
                restarts.fail_or_restart(job_id=job.pk, code=code, message=message)
            else:
                jobs.fail_job(job_id=job.pk, code=code, message=message)
        except jobs.InvalidTransition:
            continue  # it moved on meanwhile
        failed[code] += 1
    for code, count in stops.enforce(active=still_active, now=now).items():
        failed[code] += count
    return dict(failed)


def _obtained(job: TrainingJob, states: dict) -> bool:
    """A queued job whose requested machine the provider now has ready."""
    instance = getattr(job, "instance", None)
    if job.status != S.QUEUED or instance is None or not instance.external_id:
        return False
    state = states.get(instance.external_id)
    return state is not None and state.alive and state.ready


def archive_running_logs() -> int:
    """Every running job's log so far, to the store (what `logs/full` serves once it ends)."""
    written = 0
    running = TrainingJob.objects.filter(status__in=[S.CONFIGURING, S.RUNNING]).select_related(
        "workspace"
    )
    for job in running.filter(
        Q(log_archived_seq__isnull=True) | Q(log_chunks__seq__gt=F("log_archived_seq"))
    ).distinct():
        written += logs.archive_log(job=job)
    return written


def requeue_unsettled(*, now: datetime) -> int:
    """Ended jobs whose settle task was lost (its task worker killed, the broker restarted
    empty) are settled again; settling is idempotent, so one still running loses nothing."""
    ended_before = now - timedelta(seconds=settings.VERI_SETTLE_RETRY_SECONDS)
    unsettled = TrainingJob.objects.filter(finished_at__lte=ended_before, settled_at__isnull=True)
    job_ids = list(unsettled.order_by("finished_at").values_list("pk", flat=True)[:100])
    for job_id in job_ids:
        async_task("training.tasks.settle_job", job_id=job_id)
    return len(job_ids)


def watch_jobs() -> str:
    """The minute schedule: hand queued jobs their launch, and start the watchdog's tick chain
    when no tick ran lately (the first start, or a link lost with a killed task worker)."""
    _enqueue_waiting()
    return ensure_watch_chain()


def ensure_watch_chain(*, now: datetime | None = None) -> str:
    now = now or timezone.now()
    WatchdogState.objects.get_or_create(pk=1)
    run = uuid.uuid4().hex
    state = WatchdogState.objects.filter(pk=1)
    # The first start ever has nothing to forgive; a start after ticks stopped is a return.
    started = state.filter(last_tick_at__isnull=True).update(run=run, last_tick_at=now) or (
        state.filter(last_tick_at__lt=_away_before(now)).update(
            run=run, last_tick_at=now, resumed_at=now
        )
    )
    if not started:
        return "ticking"
    _next_tick(run=run, due=time.time())
    return "started"


def _away_before(now: datetime) -> datetime:
    """Ticks older than this mean the watchdog has been away."""
    return now - timedelta(seconds=max(3 * settings.VERI_WATCH_PERIOD_SECONDS, 30))


def _next_tick(*, run: str, due: float) -> None:
    async_task("training.tasks.watch_tick", run=run, due=due, save=False)


def _claim_due(field: str, every_seconds: int, now: datetime) -> bool:
    """Whether the periodic chore stamped in `field` is due, claiming it (a conditional UPDATE,
    so two overlapping ticks do not both run it)."""
    due = Q(**{f"{field}__isnull": True}) | Q(
        **{f"{field}__lte": now - timedelta(seconds=every_seconds)}
    )
    return bool(WatchdogState.objects.filter(due, pk=1).update(**{field: now}))


def watch_tick(*, run: str, due: float) -> str:
    """One watchdog tick, then the next one queued `VERI_WATCH_PERIOD_SECONDS` on: deadlines hold
    within seconds, and a task worker is never held longer than one period, so a qcluster stops
    within seconds on SIGTERM. The next link waits in the broker across a restart, so no tick
    is lost; a link of a superseded run ends the run."""
    period = settings.VERI_WATCH_PERIOD_SECONDS
    time.sleep(max(0.0, min(due - time.time(), period)))
    now = timezone.now()
    current = WatchdogState.objects.filter(pk=1, run=run)
    previous = current.values_list("last_tick_at", flat=True).first()
    # A link that waited in the broker while no task worker ran: the watchdog was away.
    back = {"resumed_at": now} if previous and previous < _away_before(now) else {}
    if not current.update(last_tick_at=now, **back):
        return "superseded"
    try:
        check_jobs(now=now)
        if _claim_due("last_archive_at", settings.VERI_LOG_ARCHIVE_SECONDS, now):
            archive_running_logs()
        if _claim_due("last_sweep_at", settings.VERI_SWEEP_SECONDS, now):
            provisioning.sweep_orphans()
        if _claim_due("last_resettle_at", settings.VERI_SETTLE_RETRY_SECONDS, now):
            requeue_unsettled(now=now)
    finally:
        _next_tick(run=run, due=time.time() + period)
    return "ticked"
