"""Veri's records in OpenAI's object shapes: files, fine-tuning jobs, their events and
checkpoints, models. Veri's own extras ride under `veri_…` names OpenAI does not use."""

import csv
import io
import re
from datetime import datetime

from openai_api.models import File, FineTuningJob
from training import hooks
from training.models import Checkpoint, JobEvent, JobStatus, MetricPoint, TrainingJob
from veri.money import usd

# A warning's index in `FineTuningJob.warnings`, a Veri job event or a step's metrics.
EventItem = int | JobEvent | MetricPoint

S = JobStatus
STATUSES = {
    S.QUEUED: "queued",
    S.PROVISIONING: "queued",
    S.CONFIGURING: "running",
    S.RUNNING: "running",
    S.COMPLETED: "succeeded",
    S.FAILED: "failed",
    S.CANCELLED: "cancelled",
}
# `ft:<base>:<workspace>:<suffix>:<id>[:ckpt-step-<n>]`: the id (the job's, without `ftjob-`)
# is what finds it; the rest is for people.
FINE_TUNED_RE = re.compile(r"ft:.+:(?P<id>[0-9a-z]{24})(?::ckpt-step-(?P<step>\d{1,9}))?")


def seconds(value: datetime | None) -> int | None:
    return int(value.timestamp()) if value else None


def file_object(file: File) -> dict:
    return {
        "id": file.public_id,
        "object": "file",
        "bytes": file.bytes,
        "created_at": seconds(file.created_at),
        "filename": file.filename,
        "purpose": file.purpose,
        "status": "processed",
        "expires_at": None,
        "status_details": None,
    }


def status_of(ft: FineTuningJob) -> str:
    if ft.paused:
        return "paused"
    return STATUSES[ft.job.status]


def _slug(value: str) -> str:
    return re.sub(r"[^a-z0-9-]+", "-", value.lower()).strip("-") or "workspace"


def fine_tuned_model(ft: FineTuningJob, *, step: int | None = None) -> str:
    base = ft.job.base_model.replace("://", "/").replace(":", "-")  # an ft: model's own base
    name = f"ft:{base}:{_slug(ft.workspace.name)}:{ft.suffix}:{ft.public_id.removeprefix('ftjob-')}"
    return f"{name}:ckpt-step-{step}" if step is not None else name


def _hyperparameters(ft: FineTuningJob) -> dict:
    """OpenAI's hyperparameters as the job runs them ("auto" resolved to Veri's values)."""
    hp = ft.job.hyperparameters
    given = (ft.method.get(ft.method["type"]) or {}).get("hyperparameters") or {}
    values = {
        "n_epochs": hp.get("epochs") or given.get("n_epochs", "auto"),
        "batch_size": hp.get("batch_size"),
        "learning_rate_multiplier": given.get("learning_rate_multiplier", 1.0),
    }
    if ft.method["type"] == "reinforcement":
        values["batch_size"] = hp["batch_size"] // hp["rollouts_per_prompt"]
        values["compute_multiplier"] = given.get("compute_multiplier", 1.0)
    if ft.method["type"] == "dpo":
        values["beta"] = hp.get("beta")
    return values


def _error(job: TrainingJob) -> dict | None:
    if job.status != S.FAILED:
        return None
    param = "training_file" if job.error_code == "invalid_dataset" else None
    return {"code": job.error_code, "message": job.error_message, "param": param}


def _estimated_finish(job: TrainingJob) -> int | None:
    """From the pace so far, when max_steps is known and training has begun."""
    total = job.hyperparameters.get("max_steps")
    if job.status != S.RUNNING or not total or not job.last_step or not job.started_at:
        return None
    elapsed = (job.last_step_at or job.started_at) - job.started_at
    per_step = elapsed.total_seconds() / job.last_step
    return seconds(job.started_at) + int(per_step * total)


def trained_tokens(job: TrainingJob) -> int | None:
    last = (job.metrics_summary or {}).get("last") or {}
    tokens = last.get("num_tokens")
    return int(tokens) if isinstance(tokens, int | float) else None


def job_object(ft: FineTuningJob) -> dict:
    job = ft.job
    money = hooks.money().job_money(job=job)
    refund = None
    if money.refund_status is not None:
        refund = {"status": money.refund_status, "amount_usd": usd(money.refund_micros or 0)}
    return {
        "id": ft.public_id,
        "object": "fine_tuning.job",
        "created_at": seconds(ft.created_at),
        "model": ft.model,
        "organization_id": ft.workspace.public_id,
        "status": status_of(ft),
        "training_file": ft.training_file,
        "validation_file": ft.validation_file or None,
        "fine_tuned_model": fine_tuned_model(ft) if job.status == S.COMPLETED else None,
        "finished_at": seconds(job.finished_at) if job.is_terminal and not ft.paused else None,
        "error": _error(job),
        "hyperparameters": _hyperparameters(ft),
        "method": ft.method,
        "result_files": [ft.result_file.public_id] if ft.result_file_id else [],
        "seed": ft.seed,
        "trained_tokens": trained_tokens(job) if job.status == S.COMPLETED else None,
        "estimated_finish": _estimated_finish(job),
        "integrations": ft.integrations or None,
        "metadata": ft.metadata,
        "user_provided_suffix": ft.suffix or None,
        "veri_job_id": job.public_id,
        "veri_cost_usd": usd(money.cost_micros) if money.cost_micros is not None else None,
        "veri_refund": refund,
    }


EVENT_MESSAGES = {
    "queued": "Fine-tuning job queued",
    "provisioning": "A machine is being prepared",
    "configuring": "Worker started: loading the data and the model",
    "running": "Fine-tuning job started",
    "completed": "The job has successfully completed",
    "cancelled": "The job was cancelled",
    "checkpoint_saved": "Checkpoint saved",
    "stop_requested": "Pausing: saving a checkpoint",
    "job_restarted": "Restarted from the newest checkpoint after a platform fault",
    "job_refunded": "Refunded: the platform's fault",
}
LEVELS = {"failed": "error", "job_restarted": "warn", "fault_refused": "warn"}


def _message(event: JobEvent) -> str:
    detail = event.detail or {}
    if event.type == "failed":
        return f"Training failed: {detail.get('code')}: {detail.get('message', '')}"
    if event.type == "cancelled" and detail.get("paused"):
        return "The job was paused; resume it to continue from its newest checkpoint"
    message = EVENT_MESSAGES.get(event.type, event.type.replace("_", " ").capitalize())
    if event.type == "checkpoint_saved" and detail.get("final"):
        message = "The fine-tuned model was saved"
    if event.type == "checkpoint_saved" and "step" in detail:
        message += f" at step {detail['step']}"
    return message


# OpenAI's metric names for what TRL logs (events, checkpoints and the result file use them).
OPENAI_METRICS = {
    "train_loss": "loss",
    "train_mean_token_accuracy": "mean_token_accuracy",
    "valid_loss": "eval_loss",
    "valid_mean_token_accuracy": "eval_mean_token_accuracy",
}


def openai_metrics(values: dict) -> dict:
    return {
        theirs: values[ours]
        for theirs, ours in OPENAI_METRICS.items()
        if isinstance(values.get(ours), int | float)
    }


def results_csv(points: dict[int, dict]) -> bytes:
    """Each step's metrics ({step: values}) as OpenAI's result file has them: its columns
    first, then every other value Veri logged."""
    extra = sorted({k for values in points.values() for k in values} - set(OPENAI_METRICS.values()))
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["step", *OPENAI_METRICS, *extra])
    for step, values in sorted(points.items()):
        named = openai_metrics(values)
        writer.writerow(
            [step, *(named.get(c, "") for c in OPENAI_METRICS), *(values.get(k, "") for k in extra)]
        )
    return buffer.getvalue().encode()


def _metrics_message(point: MetricPoint, total: int | None) -> tuple[str, dict]:
    values = point.values
    data = {"step": point.step, **values, **openai_metrics(values)}
    if total:
        data["total_steps"] = total
    shown = ", ".join(
        f"{name}={values[name]:.4g}"
        for name in ("loss", "reward", "eval_loss")
        if isinstance(values.get(name), int | float)
    )
    step = f"Step {point.step}/{total}" if total else f"Step {point.step}"
    return f"{step}: {shown}" if shown else step, data


def event_object(ft: FineTuningJob, item: EventItem) -> dict:
    """One of the job's events (a warning given at creation, a Veri job event or a step's
    metrics) as OpenAI's event object."""
    if isinstance(item, JobEvent):
        fields = {
            "id": f"ftevent-e{item.pk}",
            "created_at": seconds(item.at),
            "level": LEVELS.get(item.type, "info"),
            "message": _message(item),
            "type": "message",
            "data": item.detail or {},
        }
    elif isinstance(item, MetricPoint):
        message, data = _metrics_message(item, item.job.hyperparameters.get("max_steps"))
        fields = {
            "id": f"ftevent-m{item.pk}",
            "created_at": seconds(item.at),
            "level": "info",
            "message": message,
            "type": "metrics",
            "data": data,
        }
    else:
        fields = {
            "id": f"ftevent-w{ft.pk}x{item}",
            "created_at": seconds(ft.created_at),
            "level": "warn",
            "message": ft.warnings[item],
            "type": "message",
            "data": {},
        }
    return {"object": "fine_tuning.job.event", **fields}


def checkpoint_object(ft: FineTuningJob, checkpoint: Checkpoint, metrics: dict) -> dict:
    data = {"step": checkpoint.step, **openai_metrics(metrics)}
    return {
        "id": checkpoint.public_id,
        "object": "fine_tuning.job.checkpoint",
        "created_at": seconds(checkpoint.created_at),
        "fine_tuned_model_checkpoint": fine_tuned_model(ft, step=checkpoint.step),
        "fine_tuning_job_id": ft.public_id,
        "metrics": data,
        "step_number": checkpoint.step,
    }


def model_object(model_id: str, *, created: datetime | None, owned_by: str) -> dict:
    return {
        "id": model_id,
        "object": "model",
        "created": seconds(created) or 0,
        "owned_by": owned_by,
    }
