"""The watchdog's verdicts: what, if anything, has gone wrong with one active job, from what one
tick knows (the job's row, its provider's answer for its machine, the time). Each rule is a
function of a `Watch` returning a `Fault` or None; `verdict` asks them in order, the first
fault found being the one reported. Reads only: failing or restarting the job is the caller's."""

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import NamedTuple

from django.conf import settings

from providers import catalog
from providers.base import InstanceState
from providers.services import get_adapter
from training.models import JobStatus, MetricPoint, TrainingJob

S = JobStatus


class Fault(NamedTuple):
    """What the watchdog found: a catalog code, the message, and whether a restart (for the
    catalog's restartable codes) could help."""

    code: str
    message: str
    restart: bool = True


@dataclass(frozen=True, slots=True)
class Watch:
    """What one tick knows about one job."""

    job: TrainingJob
    state: InstanceState | None  # the provider's answer for the job's machine; None: not asked
    now: datetime
    watched_since: datetime | None  # when the watchdog last came back after being away

    @property
    def instance(self):
        return getattr(self.job, "instance", None)

    def seconds_since(self, moment: datetime) -> float:
        return (self.now - moment).total_seconds()


Rule = Callable[[Watch], Fault | None]


def last_seen(job: TrainingJob) -> str:
    step = job.last_step if job.last_step is not None else "none"
    return f"last status {job.status}, last step {step}"


# A queued job: its launch.


def capacity_withdrawn(w: Watch) -> Fault | None:
    """The provider gave up finding the machine."""
    if w.state is None or w.state.alive:
        return None
    job = w.job
    return Fault(
        "CAPACITY_UNAVAILABLE",
        f"{job.provider} could not find {job.gpu_count}x {job.gpu_type} for this job and "
        "withdrew the request. Not billed. Retry later, or pick another GPU or provider.",
    )


def launch_timed_out(w: Watch) -> Fault | None:
    job = w.job
    limit = catalog.get_provider(job.provider).launch_timeout_seconds
    if not job.launch_claimed_at or w.seconds_since(job.launch_claimed_at) <= limit:
        return None
    return Fault(
        "launch_timeout",
        f"The {job.provider} launch did not finish within {limit} s and was stopped. Not billed.",
    )


# A started job whose machine the provider says has ended: always a fault, the first that fits.


def max_run_elapsed(w: Watch) -> Fault | None:
    """The machine ended within a minute of the provider's longest run."""
    max_run = get_adapter(w.job.provider).max_run_seconds
    launched_at = w.instance.launched_at if w.instance else None
    if not (max_run and launched_at and w.seconds_since(launched_at) >= max_run - 60):
        return None
    return Fault(
        "max_run_duration_reached",
        f"{w.job.provider} ended the VM at its maximum run duration ({max_run // 3600} h).",
    )


def reclaimed(w: Watch) -> Fault | None:
    if w.state.reason != "reclaimed":
        return None
    return Fault(
        "provider_reclaimed", f"{w.job.provider} deleted or stopped the VM before the job finished."
    )


def max_run_reported(w: Watch) -> Fault | None:
    if w.state.reason != "max_run_duration":
        return None
    return Fault(
        "max_run_duration_reached",
        f"{w.job.provider} ended the VM at its maximum run duration.",
    )


def ended_before_registering(w: Watch) -> Fault | None:
    if w.job.status != S.PROVISIONING:
        return None
    return Fault(
        "provisioning_error",
        "The instance came up but the worker never registered; it has ended.",
    )


def ended_before_a_result(w: Watch) -> Fault:
    return Fault(
        "worker_failed",
        f"The instance ended before the worker reported a result ({last_seen(w.job)}).",
    )


# A provisioning job: its worker registering.


def register_timed_out(w: Watch) -> Fault | None:
    limit = catalog.get_provider(w.job.provider).register_timeout_seconds
    if not limit or w.seconds_since(w.job.provisioning_at) <= limit:
        return None
    return Fault(
        "provisioning_error",
        f"The worker did not register within {limit} s of launching. It calls "
        f"the API server back at VERI_PUBLIC_URL={settings.VERI_PUBLIC_URL}; if the "
        "server listens elsewhere, set VERI_PUBLIC_URL to its URL for the server and the "
        "qcluster, then re-submit.",
        restart=False,  # a deployment's misconfiguration: another machine would fail too
    )


def provisioning_timed_out(w: Watch) -> Fault | None:
    limit = settings.VERI_PROVISIONING_TIMEOUT_SECONDS
    if w.seconds_since(w.job.provisioning_at) <= limit:
        return None
    return Fault(
        "provisioning_timeout",
        f"No worker registered within {limit} s of the instance launching.",
    )


# A configuring job: its training starting.


def training_never_stepped(w: Watch) -> Fault | None:
    """The training process had started: the time went to customer code (the dataset, the
    reward functions' import, the model it names), not to the platform's setup."""
    limit = settings.VERI_CONFIGURING_TIMEOUT_SECONDS
    if w.seconds_since(w.job.configuring_at) <= limit or w.job.worker_phase not in (
        "training",
        "finishing",
    ):
        return None
    return Fault(
        "training_error",
        f"The training process started but reached no training step within {limit} s "
        "of the worker registering: loading the dataset, the reward functions and the "
        "model took longer than the configuring deadline.",
        restart=False,
    )


def configuring_timed_out(w: Watch) -> Fault | None:
    limit = settings.VERI_CONFIGURING_TIMEOUT_SECONDS
    if w.seconds_since(w.job.configuring_at) <= limit:
        return None
    return Fault(
        "configuring_timeout",
        f"The worker registered but did not start training within {limit} s.",
    )


# A registered job: its worker answering, its training progressing.


def silent(w: Watch) -> Fault | None:
    """heartbeat_timeout past the job's own deadline; worker_failed past 900 s (when the job's
    deadline is longer than that). Silence while the watchdog (or the whole platform) was away
    counts from its return: the worker may have been waiting for the control plane all along."""
    job = w.job
    since = job.last_heartbeat_at or job.configuring_at or job.provisioning_at
    if w.watched_since and w.watched_since > since:
        since = w.watched_since
    quiet = w.seconds_since(since)
    if quiet <= min(job.heartbeat_timeout_seconds, settings.VERI_WORKER_SILENT_SECONDS):
        return None
    if job.heartbeat_timeout_seconds < settings.VERI_WORKER_SILENT_SECONDS:
        return Fault(
            "heartbeat_timeout",
            f"The worker sent nothing for {int(quiet)} s, longer than heartbeat_timeout_seconds "
            f"({job.heartbeat_timeout_seconds} s); {last_seen(job)}. It was likely OOM-killed or "
            "lost its network.",
        )
    return Fault("worker_failed", f"The worker was silent for {int(quiet)} s; {last_seen(job)}.")


def stalled(w: Watch) -> Fault | None:
    """A running multi-GPU job whose worker still answers but whose step has not gone up for the
    longer of VERI_STALL_SECONDS and three times its median step time (the worker ends such a
    training itself, with each rank's stack; this is for a worker that cannot)."""
    job = w.job
    if job.status != S.RUNNING or job.gpu_count < 2 or job.last_step_at is None:
        return None  # not one step yet: loading a large model is not a stall
    quiet = w.seconds_since(job.last_step_at)
    if quiet <= settings.VERI_STALL_SECONDS:
        return None
    times = list(
        MetricPoint.objects.filter(job=job).order_by("-step").values_list("at", flat=True)[:21]
    )
    gaps = [
        (later - earlier).total_seconds() for later, earlier in zip(times, times[1:], strict=False)
    ]
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


QUEUED_RULES: tuple[Rule, ...] = (capacity_withdrawn, launch_timed_out)
MACHINE_ENDED_RULES: tuple[Rule, ...] = (
    max_run_elapsed,
    reclaimed,
    max_run_reported,
    ended_before_registering,
    ended_before_a_result,
)
PROVISIONING_RULES: tuple[Rule, ...] = (register_timed_out, provisioning_timed_out)
CONFIGURING_RULES: tuple[Rule, ...] = (training_never_stepped, configuring_timed_out)
REGISTERED_RULES: tuple[Rule, ...] = (silent, stalled)


def first_fault(rules: Sequence[Rule], w: Watch) -> Fault | None:
    return next((fault for rule in rules if (fault := rule(w)) is not None), None)


def verdict(
    *,
    job: TrainingJob,
    states: dict[str, InstanceState],
    now: datetime,
    watched_since: datetime | None,
) -> Fault | None:
    """The fault the watchdog finds with an active job, or None. `states`: the providers'
    answers this tick, by machine id."""
    instance = getattr(job, "instance", None)
    state = states.get(instance.external_id) if instance and instance.external_id else None
    w = Watch(job=job, state=state, now=now, watched_since=watched_since)
    if job.status == S.QUEUED:
        return first_fault(QUEUED_RULES, w)
    if state is not None and not state.alive:
        return first_fault(MACHINE_ENDED_RULES, w)
    if job.status == S.PROVISIONING:
        return first_fault(PROVISIONING_RULES, w)
    if job.status == S.CONFIGURING and (fault := first_fault(CONFIGURING_RULES, w)):
        return fault
    return first_fault(REGISTERED_RULES, w)
