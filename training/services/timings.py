"""Where a job's start-up went: when its current run entered each phase, from queued to its first
checkpoint. The control plane stamps what it sees itself (queued, launched, worker registered,
first checkpoint); the runner reports what only it knows (volumes synced, model loaded, first
step), stamped on arrival with the control plane's clock, never the worker's.

A worker's report is hostile: a phase is kept once (the first report), only in order (a phase
reported after a later one is ignored), only while the run is registered and not ended; synced
bytes are clamped to the job's mounted volumes and sync seconds to the time since registration.
The timings are shown, nothing else: no charge, refund or fault attribution reads them."""

from datetime import datetime

from django.db import transaction
from django.db.models import Sum
from django.utils import timezone

from training.models import TrainingJob
from volumes.models import Volume

WORKER_PHASES = ("volumes_synced", "model_loaded", "first_step")
# Every phase in the order a run goes through them.
PHASES = ("queued", "launched", "registered", *WORKER_PHASES, "first_checkpoint")


def _volume_bytes(job: TrainingJob) -> int:
    ids = [v["id"] for v in job.volumes]
    if not ids:
        return 0
    found = Volume.objects.filter(workspace_id=job.workspace_id, public_id__in=ids).aggregate(
        total=Sum("total_bytes")
    )
    return found["total"] or 0


def report(
    *, job: TrainingJob, phase: str, synced_bytes: int = 0, sync_seconds: float = 0.0
) -> bool:
    """The runner says its run entered `phase` (one of WORKER_PHASES) now; False when the report
    is ignored (see the module's rules)."""
    with transaction.atomic():
        locked = TrainingJob.objects.select_for_update().get(pk=job.pk)
        stamps = dict(locked.timings)
        later = PHASES[PHASES.index(phase) :]
        if (
            locked.configuring_at is None
            or locked.is_terminal
            or any(f"{p}_at" in stamps for p in later)
        ):
            return False
        now = timezone.now()
        stamps[f"{phase}_at"] = now.isoformat()
        if phase == "volumes_synced":
            since_registered = max(0.0, (now - locked.configuring_at).total_seconds())
            stamps["synced_bytes"] = min(max(0, synced_bytes), _volume_bytes(locked))
            stamps["sync_seconds"] = min(max(0.0, sync_seconds), since_registered)
        locked.timings = stamps
        locked.save(update_fields=["timings"])
    return True


def checkpoint_saved(*, job: TrainingJob) -> None:
    """A checkpoint (or the final model) of the current run was recorded: the first one's time."""
    with transaction.atomic():
        locked = TrainingJob.objects.select_for_update().get(pk=job.pk)
        if "first_checkpoint_at" not in locked.timings:
            locked.timings = {**locked.timings, "first_checkpoint_at": timezone.now().isoformat()}
            locked.save(update_fields=["timings"])


def _stamp(value: str | None) -> datetime | None:
    return datetime.fromisoformat(value) if value else None


def of(job: TrainingJob) -> dict:
    """The job's timings as the API shows them: each phase's time (None until reached), the
    bytes synced and their rate, and the seconds from queued to the first step."""
    stamps = job.timings
    at = {
        "queued": _stamp(stamps.get("queued_at")) or job.created_at,
        "launched": job.provisioning_at,
        "registered": job.configuring_at,
        **{p: _stamp(stamps.get(f"{p}_at")) for p in (*WORKER_PHASES, "first_checkpoint")},
    }
    seconds = stamps.get("sync_seconds")
    synced = stamps.get("synced_bytes")
    first_step = at["first_step"]
    return {
        **{f"{phase}_at": at[phase] for phase in PHASES},
        "synced_bytes": synced,
        "sync_seconds": seconds,
        "sync_bytes_per_second": synced / seconds if synced is not None and seconds else None,
        "until_first_step_seconds": (first_step - at["queued"]).total_seconds()
        if first_step
        else None,
    }


def steps(job: TrainingJob) -> list[dict]:
    """The phases reached, in order, each with the seconds it took to reach from the one
    before: what the CLI line and the dashboard's bar show."""
    shown = of(job)
    reached = [(p, shown[f"{p}_at"]) for p in PHASES if shown[f"{p}_at"]]
    return [
        {"phase": phase, "at": at, "seconds": (at - reached[i - 1][1]).total_seconds() if i else 0}
        for i, (phase, at) in enumerate(reached)
    ]


def new_run(job: TrainingJob) -> None:
    """A restarted run starts over, queued from now (the caller saves the job)."""
    job.timings = {"queued_at": timezone.now().isoformat()}
