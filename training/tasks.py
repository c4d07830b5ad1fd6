"""django-q2 tasks for training jobs: launching, watchdogs, settling, log archiving.
Each is idempotent and safe when two runs overlap."""

import contextlib
import logging
import statistics
import time
import uuid
from collections import defaultdict
from datetime import datetime, timedelta
from typing import NamedTuple

from django.conf import settings
from django.db.models import F, Q
from django.utils import timezone
from django_q.tasks import async_task

from providers import catalog
from providers.services import get_adapter
from training.models import JobStatus, MetricPoint, TrainingJob, WatchdogState
from training.services import jobs, logs, provisioning, restarts, stops

log = logging.getLogger(__name__)
S = JobStatus
ACTIVE = [S.QUEUED, S.PROVISIONING, S.CONFIGURING, S.RUNNING]


def provision_job(*, job_id: int) -> str:
    return provisioning.launch_job(job_id=job_id)


def settle_job(*, job_id: int) -> None:
    """Settle an ended job (see `jobs.settle_job`), then give a freed slot to the next queued
    job."""
    if jobs.settle_job(job_id=job_id):
        _enqueue_waiting()


def _enqueue_waiting(limit: int = 20) -> None:
    waiting = TrainingJob.objects.filter(status=S.QUEUED, launch_claimed_at__isnull=True)
    for job_id in waiting.order_by("pk").values_list("pk", flat=True)[:limit]:
        async_task("training.tasks.provision_job", job_id=job_id)


def _last_seen(job: TrainingJob) -> str:
    step = job.last_step if job.last_step is not None else "none"
    return f"last status {job.status}, last step {step}"


def _silent_failure(job: TrainingJob, silent: float) -> tuple[str, str] | None:
    """heartbeat_timeout past the job's own deadline; worker_failed past 900 s (when the job's
    deadline is longer than that)."""
    limit = min(job.heartbeat_timeout_seconds, settings.VERI_WORKER_SILENT_SECONDS)
    if silent <= limit:
        return None
    last = _last_seen(job)
    if job.heartbeat_timeout_seconds < settings.VERI_WORKER_SILENT_SECONDS:
        return "heartbeat_timeout", (
            f"The worker sent nothing for {int(silent)} s, longer than heartbeat_timeout_seconds "
            f"({job.heartbeat_timeout_seconds} s); {last}. It was likely OOM-killed or lost "
            "its network."
        )
    return "worker_failed", f"The worker was silent for {int(silent)} s; {last}."


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
    states = {}
    for provider, ids in instances_by_provider.items():
        try:
            states |= get_adapter(provider).states(ids)
        except Exception:  # noqa: BLE001 - one failed poll is no evidence; the next tick asks
            log.warning("could not poll %s for %d instance(s)", provider, len(ids), exc_info=True)
    watched_since = WatchdogState.objects.values_list("resumed_at", flat=True).first()
    failed: dict[str, int] = defaultdict(int)
    still_active = []
    for job in active:
        if _obtained(job, states):
            with contextlib.suppress(jobs.InvalidTransition):  # it moved on meanwhile
                jobs.machine_obtained(job=job)
            continue
        verdict = _verdict(job, states, now, watched_since)
        if not verdict and provisioning.launch_stalled(job, now=now):
            provisioning.recover_stalled_launch(job=job)
            continue
        if not verdict:
            still_active.append(job)
            continue
        code, message, restart = Fault(*verdict)
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


class Fault(NamedTuple):
    """What the watchdog found: a catalog code, the message, and whether a restart (for the
    catalog's restartable codes) could help; a verdict of (code, message) may restart."""

    code: str
    message: str
    restart: bool = True


def _verdict(
    job: TrainingJob, states: dict, now: datetime, watched_since: datetime | None
) -> tuple[str, str] | Fault | None:
    instance = getattr(job, "instance", None)
    state = states.get(instance.external_id) if instance and instance.external_id else None
    if job.status == S.QUEUED:
        if state is not None and not state.alive:  # the provider gave up finding the machine
            return "CAPACITY_UNAVAILABLE", (
                f"{job.provider} could not find {job.gpu_count}x {job.gpu_type} for this job and "
                "withdrew the request. Not billed. Retry later, or pick another GPU or provider."
            )
        spec = catalog.get_provider(job.provider)
        if (
            job.launch_claimed_at
            and (now - job.launch_claimed_at).total_seconds() > spec.launch_timeout_seconds
        ):
            return "launch_timeout", (
                f"The {job.provider} launch did not finish within "
                f"{spec.launch_timeout_seconds} s and was stopped. Not billed."
            )
        return None
    if state is not None and not state.alive:
        max_run = get_adapter(job.provider).max_run_seconds
        if (
            max_run
            and instance.launched_at
            and (now - instance.launched_at).total_seconds() >= max_run - 60
        ):
            return (
                "max_run_duration_reached",
                f"{job.provider} ended the VM at its maximum run duration ({max_run // 3600} h).",
            )
        if state.reason == "reclaimed":
            return (
                "provider_reclaimed",
                f"{job.provider} deleted or stopped the VM before the job finished.",
            )
        if state.reason == "max_run_duration":
            return (
                "max_run_duration_reached",
                f"{job.provider} ended the VM at its maximum run duration.",
            )
        if job.status == S.PROVISIONING:
            return (
                "provisioning_error",
                "The instance came up but the worker never registered; it has ended.",
            )
        return "worker_failed", (
            f"The instance ended before the worker reported a result ({_last_seen(job)})."
        )
    if job.status == S.PROVISIONING:
        waited = (now - job.provisioning_at).total_seconds()
        register_limit = catalog.get_provider(job.provider).register_timeout_seconds
        if register_limit and waited > register_limit:
            return Fault(
                "provisioning_error",
                f"The worker did not register within {register_limit} s of launching. It calls "
                f"the API server back at VERI_PUBLIC_URL={settings.VERI_PUBLIC_URL}; if the "
                "server listens elsewhere, set VERI_PUBLIC_URL to its URL for the server and the "
                "qcluster, then re-submit.",
                restart=False,  # a deployment's misconfiguration: another machine would fail too
            )
        if waited > settings.VERI_PROVISIONING_TIMEOUT_SECONDS:
            return "provisioning_timeout", (
                f"No worker registered within {settings.VERI_PROVISIONING_TIMEOUT_SECONDS} s "
                "of the instance launching."
            )
        return None
    if job.status == S.CONFIGURING:
        waited = (now - job.configuring_at).total_seconds()
        limit = settings.VERI_CONFIGURING_TIMEOUT_SECONDS
        if waited > limit and job.worker_phase in ("training", "finishing"):
            # The training process had started: the time went to customer code (the dataset,
            # the reward functions' import, the model it names), not to the platform's setup.
            return Fault(
                "training_error",
                f"The training process started but reached no training step within {limit} s "
                "of the worker registering: loading the dataset, the reward functions and the "
                "model took longer than the configuring deadline.",
                restart=False,
            )
        if waited > limit:
            return "configuring_timeout", (
                f"The worker registered but did not start training within {limit} s."
            )
    silent_since = job.last_heartbeat_at or job.configuring_at or job.provisioning_at
    if watched_since and watched_since > silent_since:
        # Silence while the watchdog (or the whole platform) was away counts from its return:
        # the worker may have been waiting for the control plane all along.
        silent_since = watched_since
    silent = _silent_failure(job, (now - silent_since).total_seconds())
    if silent or job.status != S.RUNNING or job.gpu_count < 2:
        return silent
    return _stalled(job, now)


def _stalled(job: TrainingJob, now: datetime) -> Fault | None:
    """A multi-GPU job whose worker still answers but whose step has not gone up for the longer
    of VERI_STALL_SECONDS and three times its median step time (the worker ends such a training
    itself, with each rank's stack; this is for a worker that cannot)."""
    if job.last_step_at is None:
        return None  # not one step yet: loading a large model is not a stall
    quiet = (now - job.last_step_at).total_seconds()
    if quiet <= settings.VERI_STALL_SECONDS:
        return None
    times = list(
        MetricPoint.objects.filter(job=job).order_by("-step").values_list("at", flat=True)[:21]
    )
    pairs = zip(times, times[1:], strict=False)
    gaps = [(later - earlier).total_seconds() for later, earlier in pairs]
    window = max(settings.VERI_STALL_SECONDS, 3 * statistics.median(gaps) if gaps else 0)
    if quiet <= window:
        return None
    return Fault(
        "training_stalled",
        f"No training step for {int(quiet)} s (last step {job.last_step}) while the worker still "
        f"answers: longer than {int(window)} s, the stall window. The log tail shows where it "
        "waited.",
        restart=False,
    )


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
