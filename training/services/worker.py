"""What the worker on the instance reports, and what it is handed (spec, credentials)."""

import contextlib
import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Case, F, Q, Value, When
from django.utils import timezone

from training import errors
from training.models import (
    TERMINAL,
    Checkpoint,
    Dataset,
    JobEvent,
    JobStatus,
    JobToken,
    MetricPoint,
    Sample,
    TrainingJob,
)
from training.services import alarms, integrations, jobs, logs, restarts, stops, timings
from training.services.jobs import InvalidTransition, machine_obtained, transition_job
from training.services.records import insert_new
from veri.errors import Conflict, VeriError
from volumes import selectors as volume_selectors
from volumes.models import Volume
from volumes.services import schedule_store_deletion, validate_path
from volumes.stores import keys, store_for
from worker.build import build_id

S = JobStatus
TOKEN_PREFIX = "vjt_"


def _hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def _new_token(job: TrainingJob, now) -> tuple[str, JobToken]:
    token = f"{TOKEN_PREFIX}{secrets.token_hex(32)}"
    lifetime = timedelta(seconds=settings.VERI_JOB_TOKEN_TTL_SECONDS)
    row = JobToken.objects.create(job=job, token_hash=_hash(token), expires_at=now + lifetime)
    return token, row


@transaction.atomic
def mint_job_token(*, job: TrainingJob) -> str:
    """A fresh token for the job's worker, valid for VERI_JOB_TOKEN_TTL_SECONDS; every earlier
    token of the job dies at once (a relaunch supersedes the last run's worker). The job's row
    lock orders this with a renewal in flight, which could otherwise add a token after the
    delete."""
    TrainingJob.objects.select_for_update().filter(pk=job.pk).first()
    JobToken.objects.filter(job=job).delete()
    return _new_token(job, timezone.now())[0]


def _unexpired_token(raw: str, now) -> JobToken | None:
    """The token's row while it has not expired nor been replaced, whatever its job's status."""
    if not raw.startswith(TOKEN_PREFIX):
        return None
    row = (
        JobToken.objects.select_related("job", "job__workspace")
        .filter(token_hash=_hash(raw), expires_at__gt=now)
        .first()
    )
    if row is None or not hmac.compare_digest(row.token_hash, _hash(raw)):
        return None
    return row


def _live_token(raw: str, now) -> JobToken | None:
    row = _unexpired_token(raw, now)
    return None if row is None or row.job.is_terminal else row


def authenticate_release_token(*, raw: str) -> TrainingJob | None:
    """The job of a token that has neither expired nor been replaced, also once the job has
    ended: the one thing an ended job's machine may still ask is to be deleted. A relaunch
    replaces the tokens, so an earlier run's machine cannot release the new one."""
    row = _unexpired_token(raw, timezone.now())
    return row.job if row else None


def authenticate_job_token(*, raw: str) -> TrainingJob | None:
    """The job a live token belongs to; None when unknown, expired, replaced (by a relaunch,
    or by its renewal once the overlap has passed), or when the job has finished."""
    row = _live_token(raw, timezone.now())
    return row.job if row else None


@dataclass(frozen=True, slots=True)
class RenewedToken:
    token: str
    expires_at: datetime
    renew_after_seconds: int


def renew_job_token(*, raw: str) -> RenewedToken | None:
    """The runner's token renewal, while its job lives: a fresh token for the full lifetime. The
    token it renewed with keeps working for VERI_JOB_TOKEN_OVERLAP_SECONDS more (requests
    already sent with it), never longer than it had; any other token of the job dies, so a
    renewal whose answer was lost can be asked again with the same token. None when `raw` is
    not live (the job ended, was cancelled or relaunched, or the token expired)."""
    now = timezone.now()
    with transaction.atomic():
        row = _live_token(raw, now)
        if row is None:
            return None
        # The job's row lock: a restart or a relaunch deleting the job's tokens meanwhile
        # either sees the token made here or makes this renewal find its token gone.
        job = TrainingJob.objects.select_for_update().get(pk=row.job_id)
        row = JobToken.objects.filter(pk=row.pk, expires_at__gt=now).first()
        if row is None or job.is_terminal:
            return None
        JobToken.objects.filter(job=job).exclude(pk=row.pk).delete()
        overlap = now + timedelta(seconds=settings.VERI_JOB_TOKEN_OVERLAP_SECONDS)
        JobToken.objects.filter(pk=row.pk).update(expires_at=min(row.expires_at, overlap))
        token, fresh = _new_token(job, now)
    return RenewedToken(
        token=token,
        expires_at=fresh.expires_at,
        renew_after_seconds=max(1, settings.VERI_JOB_TOKEN_TTL_SECONDS // 2),
    )


def register(*, job: TrainingJob, info: dict) -> TrainingJob:
    """The worker is up: provisioning → configuring (a re-register while configuring is fine).
    A worker on a machine the watchdog has not yet seen obtained (Flex-start) moves it on. A
    worker of other code than this control plane serves is refused and the job fails as the
    platform's `provisioning_error` (a mirror or VERI_WORKER_PACKAGE serving another version):
    it would run another protocol and other checks."""
    if info["build"] != build_id():
        message = (
            f"The machine installed worker build {info['build']}, not this control plane's "
            f"{build_id()}: check VERI_WORKER_PACKAGE and VERI_WORKER_INDEX_URL, or unset them "
            "to install the worker the control plane serves."
        )
        with contextlib.suppress(InvalidTransition):  # ended meanwhile: the first end stands
            jobs.fail_job(job_id=job.pk, code="provisioning_error", message=message)
        raise Conflict(message, code="worker_version_mismatch")
    if job.status == S.QUEUED:
        job = machine_obtained(job=job)
    job = transition_job(job_id=job.pk, to=S.CONFIGURING, detail={"worker": info})
    # A run starts syncing; a second register of the same run does not take it back there.
    TrainingJob.objects.filter(pk=job.pk, worker_phase="").update(worker_phase="sync")
    heartbeat(job=job, step=None)
    return job


def enter_phase(*, job: TrainingJob, phase: str) -> TrainingJob:
    """The runner moved on to `phase` (`errors.PHASES`): forward only, never back."""
    order = errors.PHASES
    if phase not in order:
        raise VeriError(
            f"phase must be one of: {', '.join(order)}.", field="phase", code="invalid_phase"
        )
    with transaction.atomic():
        locked = TrainingJob.objects.select_for_update().get(pk=job.pk)
        now = order.index(locked.worker_phase) if locked.worker_phase in order else -1
        if order.index(phase) < now:
            raise Conflict(
                f"The run is past {phase!r} (it is in {locked.worker_phase!r}); phases only go "
                "forward.",
                code="invalid_phase",
            )
        if order.index(phase) > now:
            locked.worker_phase = phase
            locked.save(update_fields=["worker_phase"])
    return locked


def report_status(*, job: TrainingJob, status: str) -> TrainingJob:
    """The only move a worker asks for itself: configuring → running (training started)."""
    if status != S.RUNNING:
        raise VeriError(
            "A worker may only report status 'running'; finish with /complete.",
            field="status",
            code="invalid_status",
        )
    return transition_job(job_id=job.pk, to=S.RUNNING)


def preemption_notice(*, job: TrainingJob, source: str, terminates_at) -> None:
    """The provider warned the worker that its machine is going away; the worker is saving a
    checkpoint. Shown on the job once per attempt; the restart itself waits for the evidence
    (the provider's machine gone), as a worker's word alone restarts nothing."""
    already = JobEvent.objects.filter(
        job=job, type="preemption_notice", detail__attempt=job.attempt
    ).exists()
    if not already:
        detail = {"attempt": job.attempt, "source": source, "step": job.last_step}
        if terminates_at:
            detail["terminates_at"] = terminates_at.isoformat()
        JobEvent.objects.create(job=job, type="preemption_notice", detail=detail)


def heartbeat(*, job: TrainingJob, step: int | None) -> None:
    now = timezone.now()
    updates = {"last_heartbeat_at": now}
    if step is not None:
        went_up = Q(last_step__isnull=True) | Q(last_step__lt=step)
        updates |= {
            "last_step": step,
            "last_step_at": Case(When(went_up, then=Value(now)), default=F("last_step_at")),
        }
    TrainingJob.objects.filter(pk=job.pk).update(**updates)


@transaction.atomic
def record_metrics(*, job: TrainingJob, points: list[dict]) -> int:
    """`[{step, values, at?}]`; a step already recorded keeps its first values (a restarted
    run's replay of one is checked against them)."""
    restarts.verify_replay(job=job, points=points)
    now = timezone.now()
    rows = [
        MetricPoint(job=job, step=p["step"], values=p["values"], at=p.get("at") or now)
        for p in points
    ]
    added = insert_new(MetricPoint, job=job, key="step", rows=rows)
    if not added:
        return 0
    locked = TrainingJob.objects.select_for_update().get(pk=job.pk)
    summary = locked.metrics_summary or {"steps": 0, "last_step": None, "first": {}, "last": {}}
    for point in sorted(added, key=lambda p: p.step):
        for name, value in point.values.items():
            summary["first"].setdefault(name, value)
            if summary["last_step"] is None or point.step >= summary["last_step"]:
                summary["last"][name] = value
        summary["last_step"] = max(summary["last_step"] or 0, point.step)
    summary["steps"] += len(added)
    locked.metrics_summary = summary
    if summary["last_step"] > (locked.last_step or -1):
        locked.last_step, locked.last_step_at = summary["last_step"], now
    locked.save(update_fields=["metrics_summary", "last_step", "last_step_at"])
    alarms.check_metrics(job=job)
    return len(added)


def record_samples(*, job: TrainingJob, samples: list[dict]) -> int:
    """`[{step, index, prompt, completion, reward, rewards}]`; a sample already recorded (a
    resent batch) keeps its first values."""
    keys = {(s["step"], s["index"]) for s in samples}
    stored = set(
        Sample.objects.filter(job=job, step__in={step for step, _ in keys}).values_list(
            "step", "index"
        )
    )
    new = {(s["step"], s["index"]): s for s in samples if (s["step"], s["index"]) not in stored}
    Sample.objects.bulk_create(
        [Sample(job=job, **sample) for sample in new.values()], ignore_conflicts=True
    )
    if new:
        alarms.check_samples(job=job)
    return len(new)


OUTPUT_FOLDERS = ("checkpoints", "final")
CHECKPOINT_FOLDER_RE = re.compile(r"step-[0-9]{8}")


def validate_output_path(path: str, *, field: str = "path") -> str:
    """A file the worker may write: `final/…` or `checkpoints/step-NNNNNNNN/…` inside its own
    job's folder, under the volume path rules. Its log and other jobs are out of reach."""
    validate_path(path, field=field)
    top, _, rest = path.partition("/")
    folder, _, inner = rest.partition("/")
    allowed = (top == "final" and rest) or (
        top == "checkpoints" and CHECKPOINT_FOLDER_RE.fullmatch(folder) and inner
    )
    if not allowed:
        raise VeriError(
            f"A worker writes only final/<file> or checkpoints/step-NNNNNNNN/<file>; {path!r} is "
            "refused.",
            field=field,
            code="invalid_path",
        )
    return path


def register_checkpoint(
    *, job: TrainingJob, step: int, files: list[dict], final: bool
) -> Checkpoint:
    """Record a checkpoint the worker uploaded under `final/` or `checkpoints/step-…/`; every
    file must be in the store with its size. Keeps the newest `checkpoint_keep` intermediate
    ones. Paths are checked before anything is read or written."""
    for index, file in enumerate(files):
        validate_path(file["path"], field=f"files.{index}.path")
    prefix = keys.checkpoint_prefix(job.output_prefix, step=step, final=final)
    stored = store_for(job.output_prefix).stat_many([prefix.key(f["path"]) for f in files])
    missing = [
        f["path"]
        for f in files
        if (s := stored.get(prefix.key(f["path"]))) is None or s.size != f["size"]
    ]
    if missing:
        raise VeriError(
            f"These checkpoint files are not in the store with their size: "
            f"{', '.join(missing[:10])}.",
            field="files",
            code="checkpoint_incomplete",
        )
    with transaction.atomic():
        checkpoint, created = Checkpoint.objects.get_or_create(
            job=job,
            step=step,
            final=final,
            defaults={
                "workspace": job.workspace,
                "files": [
                    {"path": f["path"], "size": f["size"], "sha256": f.get("sha256", "")}
                    for f in files
                ],
                "size_bytes": sum(f["size"] for f in files),
            },
        )
        if created:
            timings.checkpoint_saved(job=job)
            JobEvent.objects.create(
                job=job,
                type="checkpoint_saved",
                detail={"checkpoint_id": checkpoint.public_id, "step": step, "final": final},
            )
            old = Checkpoint.objects.filter(job=job, final=False).order_by("-step")[
                job.checkpoint_keep :
            ]
            for stale in list(old):
                stale.job = job
                schedule_store_deletion(
                    prefix=stale.prefix, reason=f"checkpoint beyond keep ({job})"
                )
                stale.delete()
    return checkpoint


def complete(*, job: TrainingJob, ok: bool, error_code: str | None, message: str) -> TrainingJob:
    """The worker's final word: completed, or failed with a code from the catalog."""
    if ok:
        try:
            return transition_job(job_id=job.pk, to=S.COMPLETED)
        except InvalidTransition:
            job.refresh_from_db()
            if job.status in TERMINAL:
                return job
            raise
    stop_code = TrainingJob.objects.filter(pk=job.pk).values_list("stop_code", flat=True).first()
    if error_code == stops.PAUSED and stop_code == stops.PAUSED:
        try:  # the customer's pause, as asked: no fault of anyone's
            return stops.end_paused(job_id=job.pk)
        except InvalidTransition:
            job.refresh_from_db()
            return job
    if error_code not in errors.WORKER_CODES:
        raise VeriError(
            f"Unknown error code {error_code!r}; a worker reports one of: "
            f"{', '.join(errors.WORKER_CODES)}.",
            field="error_code",
            code="invalid_error_code",
        )
    phase = TrainingJob.objects.filter(pk=job.pk).values_list("worker_phase", flat=True).first()
    if not errors.believed(error_code, phase=phase):
        # Money follows attribution: a platform fault from a phase whose checks cannot find it
        # is not the platform's word. Recorded for operators; the run ends as its own error.
        JobEvent.objects.create(
            job=job,
            type="fault_refused",
            detail={"code": error_code, "phase": phase, "message": message[:2000]},
        )
        message = (
            f"The worker reported {error_code} during the {phase or 'unregistered'} phase, "
            "where none of the platform's own checks runs, so it counts as the job's own "
            f"error. Its message: {message}"
        )
        error_code = "training_error"
    try:
        if error_code == "provisioning_error" and not phase:
            # The bootstrap's report (no worker yet): the deployment's setup, which another
            # machine would meet the same way, so the job ends rather than restarting.
            return jobs.fail_job(job_id=job.pk, code=error_code, message=message)
        return restarts.fail_or_restart(job_id=job.pk, code=error_code, message=message)
    except InvalidTransition:
        job.refresh_from_db()
        if job.status in TERMINAL:
            return job  # cancelled or failed meanwhile: the first terminal state stands
        raise


def volume_files(*, job: TrainingJob) -> list[tuple[Volume, list[dict]]]:
    """Each mounted volume with the files the worker must find after syncing it: those pinned
    when the job was submitted, for every run."""
    mounted = volume_selectors.volumes_with_files(
        workspace=job.workspace,
        volume_ids=[v["id"] for v in job.volumes],
        pinned_by=job.pin_holder if job.inputs_digest else None,
    )
    if len(mounted) != len(job.volumes):
        found = {volume.public_id for volume, _ in mounted}
        gone = [v["name"] for v in job.volumes if v["id"] not in found]
        raise Conflict(f"Volumes deleted since submit: {', '.join(gone)}.", code="volume_gone")
    return mounted


def volume_credentials(*, job: TrainingJob, ttl: int = 1800) -> dict:
    """Read access to the mounted volumes and nothing else: credentials scoped to each volume's
    folder (STS on S3) or signed GET URLs per file (local store). Short-lived; the worker asks
    again to refresh."""
    store, answer = store_for(job.workspace_prefix), []
    for volume, files in volume_files(job=job):
        objects = list(dict.fromkeys(f["object_key"] for f in files))  # a pack serves many
        credentials, where = store.read_grant(volume.store_prefix, objects, ttl=ttl)
        answer.append(
            {
                "id": volume.public_id,
                "name": volume.name,
                "file_count": volume.file_count,
                "total_bytes": volume.total_bytes,
                "credentials": credentials,
                "files": [f | where[f["object_key"]] for f in files],
            }
        )
    return {"ttl_seconds": ttl, "volumes": answer}


def output_urls(
    *, job: TrainingJob, files: list[dict], sent_as: str = "files", ttl: int = 3600
) -> list[dict]:
    """Presigned PUTs for the worker's checkpoint and final-model files (`{path, sha256}`), each
    checked by `validate_output_path` and by the store opened on the job's own folder. With a
    sha256 the store itself refuses other bytes. `sent_as` names the request's field in errors:
    `files` (objects with a path) or `paths` (bare strings)."""
    for index, file in enumerate(files):
        field = f"files.{index}.path" if sent_as == "files" else f"paths.{index}"
        validate_output_path(file["path"], field=field)
    store, answer = store_for(job.output_prefix), []
    for file in files:
        url, headers = store.presign_put(
            job.output_prefix.key(file["path"]), expires=ttl, sha256=file.get("sha256") or None
        )
        answer.append({"path": file["path"], "url": url, "headers": headers})
    return answer


def _dataset_spec(dataset: Dataset, store, ttl: int) -> dict:
    """Where the worker reads a dataset: a presigned URL, a hub id, or a volume's file."""
    data: dict = {"id": dataset.public_id, "source": dataset.source}
    if dataset.source == Dataset.Source.UPLOAD:
        data["url"] = store.presign_get(dataset.object_key, expires=ttl)
    elif dataset.source == Dataset.Source.HF:
        data |= {
            "repo": dataset.hf_repo,
            "split": dataset.hf_split,
            "revision": dataset.hf_revision,
        }
    else:
        data |= {"volume": dataset.volume_name, "path": dataset.path}
    return data


def checkpoint_spec(checkpoint: Checkpoint, store, ttl: int) -> dict:
    """A checkpoint's files, each with a presigned URL: a run resumes from it, or trains on
    from its adapter."""
    return {
        "checkpoint_id": checkpoint.public_id,
        "step": checkpoint.step,
        "files": [
            {"path": f["path"], "size": f["size"], "url": store.presign_get(key, expires=ttl)}
            for f, key in checkpoint.file_keys()
        ],
    }


def heartbeat_interval(job: TrainingJob) -> int:
    """Seconds between the worker's heartbeats: a tenth of the job's heartbeat timeout, 5 to 30 s,
    and no more than `VERI_WORKER_HEARTBEAT_MAX_SECONDS`."""
    tenth = max(5, min(30, job.heartbeat_timeout_seconds // 10))
    return max(1, min(tenth, settings.VERI_WORKER_HEARTBEAT_MAX_SECONDS))


def build_spec(*, job: TrainingJob) -> dict:
    """Everything the worker needs to run the job."""
    store, ttl = store_for(job.workspace_prefix), settings.VERI_PRESIGN_TTL_SECONDS
    validation = job.validation_dataset
    resume, adapter = job.resume_from, job.adapter_from
    return {
        "job_id": job.public_id,
        "method": job.method,
        "base_model": job.base_model,
        "dataset": _dataset_spec(job.dataset, store, ttl),
        "validation_dataset": validation and _dataset_spec(validation, store, ttl),
        "reward_source": job.reward_source,
        "output_name": job.output_name,
        "hyperparameters": job.hyperparameters,
        "lora": job.lora,
        "gpu_type": job.gpu_type,
        "gpu_count": job.gpu_count,
        "volumes": [{"id": v["id"], "name": v["name"]} for v in job.volumes],
        "checkpoint_every": job.checkpoint_every,
        "checkpoint_keep": job.checkpoint_keep,
        "heartbeat_interval_seconds": heartbeat_interval(job),
        "samples_every": job.samples_every,
        "resume_from": resume and checkpoint_spec(resume, store, ttl),
        "adapter_from": adapter and checkpoint_spec(adapter, store, ttl),
        "attempt": job.attempt,
        "integrations": job.integrations,
        "wandb_mode": settings.VERI_WANDB_MODE,
        # For the runner alone, which keeps them from the training process (worker.runner).
        "secrets": integrations.runner_secrets(
            workspace=job.workspace, integrations=job.integrations
        ),
        # A restarted job's new run numbers its log lines after the earlier runs' lines.
        "log_seq_start": logs.next_seq(job=job),
    }


def append_logs(*, job: TrainingJob, lines: list[dict]) -> int:
    added = logs.append_lines(job=job, lines=lines)
    heartbeat(job=job, step=None)
    return added
