"""OpenAI fine-tuning jobs, translated onto Veri training jobs: the same submit, billing,
workers, refunds and catalog underneath. `method` picks Veri's method (supervised → sft_text,
dpo → dpo, reinforcement → grpo with the grader as its reward); OpenAI's hyperparameters map
onto Veri's (`HYPERPARAMETERS`); a pause ends the running Veri job with a checkpoint and a
resume starts the next from it, under the same `ftjob-…` id."""

import math
import re
import secrets

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from openai_api import objects, selectors
from openai_api.models import File, FineTuningJob
from openai_api.services import files
from training import specs
from training.models import Checkpoint, JobStatus, TrainingJob
from training.services import jobs as training_jobs
from training.services import stops
from veri.errors import Conflict, NotFound, VeriError
from veri.models import Workspace
from webhooks.services import publish
from worker import graders

METHODS = {"supervised": "sft_text", "dpo": "dpo", "reinforcement": "grpo"}
# Each OpenAI hyperparameter: the methods it applies to, its type and range.
HYPERPARAMETERS = {
    "n_epochs": (("supervised", "dpo", "reinforcement"), int, 1, 50),
    "batch_size": (("supervised", "dpo", "reinforcement"), int, 1, 256),
    "learning_rate_multiplier": (("supervised", "dpo", "reinforcement"), float, 0, 10_000),
    "beta": (("dpo",), float, 0, 2),
    "compute_multiplier": (("reinforcement",), float, 0, 10),
    "eval_interval": (("reinforcement", "supervised", "dpo"), int, 1, 1_000_000),
    "eval_samples": (("reinforcement", "supervised", "dpo"), int, 1, 1_000_000),
    "reasoning_effort": (("reinforcement",), str, None, None),
}
REASONING_EFFORTS = ("default", "low", "medium", "high")
SUFFIX_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")
# Veri options the OpenAI client passes through `extra_body={"veri": {...}}`.
# `hyperparameters` are Veri's own (max_response_length, max_steps...), over the translated ones.
VERI_OPTIONS = (
    "gpu_type",
    "gpu_count",
    "provider",
    "region",
    "max_cost_usd",
    "lora",
    "hyperparameters",
    "checkpoint_every",
)
DEFAULT_ROLLOUTS = specs.DEFAULTS["grpo"]["rollouts_per_prompt"]
DEFAULT_PROMPTS_PER_STEP = specs.DEFAULTS["grpo"]["batch_size"] // DEFAULT_ROLLOUTS
# Checkpoints kept, as OpenAI keeps the last three epochs'.
CHECKPOINTS_KEPT = 3


def _hyperparameters(kind: str, given: object, *, param: str) -> tuple[dict, list[str]]:
    """OpenAI's hyperparameters checked: the values given ("auto" drops one), and warnings for
    those taken but ignored."""
    if given is None:
        return {}, []
    if not isinstance(given, dict):
        raise VeriError(f"{param} must be an object.", field=param)
    values, warnings = {}, []
    for name, value in given.items():
        rule = HYPERPARAMETERS.get(name)
        if rule is None or kind not in rule[0]:
            known = ", ".join(n for n, r in HYPERPARAMETERS.items() if kind in r[0])
            raise VeriError(
                f"Unknown hyperparameter {name!r} for {kind}; known: {known}.",
                field=f"{param}.{name}",
            )
        if value == "auto" or value is None:
            continue
        _, kind_of, low, high = rule
        if name == "reasoning_effort":
            if value not in REASONING_EFFORTS:
                raise VeriError(
                    f"reasoning_effort must be one of {', '.join(REASONING_EFFORTS)}.",
                    field=f"{param}.{name}",
                )
            warnings.append(
                "reasoning_effort is ignored: the open models Veri trains have no reasoning "
                "effort setting."
            )
            continue
        number_ok = isinstance(value, int | float) and not isinstance(value, bool)
        if kind_of is int and number_ok and value != int(value):
            number_ok = False
        if not number_ok or not (low < value <= high if kind_of is float else low <= value <= high):
            bound = f"above {low}" if kind_of is float else f"at least {low}"
            what = "a whole number" if kind_of is int else "a number"
            raise VeriError(
                f'{name} must be "auto" or {what} {bound} and at most {high}.',
                field=f"{param}.{name}",
            )
        values[name] = kind_of(value)
    return values, warnings


def _steps_per_epoch(rows: int, prompts_per_step: int) -> int:
    return max(1, math.ceil(rows / prompts_per_step))


def translate_hyperparameters(kind: str, given: dict, *, rows: int) -> tuple[dict, int]:
    """Veri's hyperparameters for OpenAI's, and the steps between checkpoints (one per epoch,
    as OpenAI saves them)."""
    method = METHODS[kind]
    defaults = specs.DEFAULTS[method]
    veri: dict = {}
    if "learning_rate_multiplier" in given:
        veri["learning_rate"] = defaults["learning_rate"] * given["learning_rate_multiplier"]
    for name in ("eval_interval", "eval_samples"):
        if name in given:
            veri[name] = given[name]
    if method == "grpo":
        rollouts = DEFAULT_ROLLOUTS
        if "compute_multiplier" in given:
            rollouts = min(64, max(2, round(DEFAULT_ROLLOUTS * given["compute_multiplier"])))
        prompts = given.get("batch_size", DEFAULT_PROMPTS_PER_STEP)
        veri |= {"rollouts_per_prompt": rollouts, "batch_size": prompts * rollouts}
        per_epoch = _steps_per_epoch(rows, prompts)
        if "n_epochs" in given:
            veri["max_steps"] = per_epoch * given["n_epochs"]
        return veri, per_epoch
    if "n_epochs" in given:
        veri["epochs"] = given["n_epochs"]
    if "batch_size" in given:
        veri["batch_size"] = given["batch_size"]
    if "beta" in given:
        veri["beta"] = given["beta"]
    return veri, _steps_per_epoch(rows, veri.get("batch_size", defaults["batch_size"]))


def _method(body: dict) -> tuple[str, dict, dict, list[str]]:
    """(OpenAI method type, its hyperparameters as given, the method object, warnings)."""
    method = body.get("method")
    legacy = body.get("hyperparameters")
    if method is None:
        method = {"type": "supervised", "supervised": {"hyperparameters": legacy or {}}}
    elif legacy is not None:
        raise VeriError(
            "Give hyperparameters inside method, not at the top level as well.",
            field="hyperparameters",
        )
    if not isinstance(method, dict):
        raise VeriError("method must be an object.", field="method")
    kind = method.get("type")
    if kind not in METHODS:
        raise VeriError(
            f"method.type must be one of {', '.join(METHODS)}; got {str(kind)[:40]!r}.",
            field="method.type",
            code="invalid_method",
        )
    options = method.get(kind) or {}
    if not isinstance(options, dict):
        raise VeriError(f"method.{kind} must be an object.", field=f"method.{kind}")
    hyperparameters, warnings = _hyperparameters(
        kind, options.get("hyperparameters"), param=f"method.{kind}.hyperparameters"
    )
    return kind, hyperparameters, {"type": kind, kind: options}, warnings


def _file(workspace: Workspace, file_id: object, *, param: str) -> File:
    file = File.objects.filter(workspace=workspace, public_id=file_id).first()
    if file is None or file.purpose != File.Purpose.FINE_TUNE:
        raise VeriError(
            f"No fine-tune file {str(file_id)[:60]!r} in this workspace; upload it with "
            'purpose="fine-tune".',
            field=param,
            code="invalid_file",
        )
    return file


def _metadata(value: object) -> dict | None:
    if value is None:
        return None
    if (
        not isinstance(value, dict)
        or len(value) > 16
        or not all(
            isinstance(k, str) and len(k) <= 64 and isinstance(v, str) and len(v) <= 512
            for k, v in value.items()
        )
    ):
        raise VeriError(
            "metadata must be up to 16 string keys (64 characters) with string values (512).",
            field="metadata",
        )
    return value


def _veri_options(value: object) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict) or set(value) - set(VERI_OPTIONS):
        raise VeriError(f"veri takes only: {', '.join(VERI_OPTIONS)}.", field="veri")
    if not isinstance(value.get("hyperparameters", {}), dict):
        raise VeriError("veri.hyperparameters must be an object.", field="veri.hyperparameters")
    return value


# Where Veri's own field names a problem, the OpenAI parameter it came from.
PARAMS = {"dataset_id": "training_file", "base_model": "model", "reward_source": "grader"}


def _as_openai_param(exc: VeriError, kind: str) -> VeriError:
    field = exc.field or ""
    if field in PARAMS:
        exc.field = PARAMS[field]
    elif field.startswith("hyperparameters."):
        exc.field = f"method.{kind}.hyperparameters"
    return exc


def _submission(
    *, body: dict, kind: str, hyperparameters: dict, file: File
) -> training_jobs.Submission:
    """The Veri job an OpenAI create asks for (its files already checked)."""
    veri, per_epoch = translate_hyperparameters(
        kind, hyperparameters, rows=file.dataset.row_count or 1
    )
    reward_source = ""
    if kind == "reinforcement":
        grader = (body["method"].get("reinforcement") or {}).get("grader")
        if not isinstance(grader, dict):
            raise VeriError(
                "A reinforcement job needs method.reinforcement.grader.", field="grader"
            )
        try:
            graders.check_grader(grader)
        except graders.GraderError as exc:
            raise VeriError(
                exc.message, field=f"method.reinforcement.{exc.param}", code="invalid_grader"
            ) from None
        reward_source = graders.reward_source(grader)
    options = _veri_options(body.get("veri"))
    seed = body.get("seed")
    if seed is None:
        seed = secrets.randbelow(2**31)
    elif isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**31:
        raise VeriError("seed must be a whole number from 0 to 2147483647.", field="seed")
    return training_jobs.Submission(
        base_model=body.get("model") or "",
        dataset_id=file.dataset.public_id,
        method=METHODS[kind],
        reward_source=reward_source,
        output_name=body.get("suffix") or "",
        hyperparameters=veri | (options.get("hyperparameters") or {}) | {"seed": seed},
        lora=options.get("lora"),
        gpu_type=options.get("gpu_type", settings.VERI_OPENAI_GPU_TYPE),
        gpu_count=options.get("gpu_count", 1),
        provider=options.get("provider"),
        region=options.get("region"),
        checkpoint_every=options.get("checkpoint_every", per_epoch),
        checkpoint_keep=CHECKPOINTS_KEPT,
        max_cost_usd=options.get("max_cost_usd"),
    )


def create_job(*, workspace: Workspace, body: dict) -> FineTuningJob:
    if not isinstance(body.get("model"), str) or not body["model"]:
        raise VeriError("model is required: a Hugging Face repo id or volume://…", field="model")
    kind, hyperparameters, method, warnings = _method(body)
    suffix = body.get("suffix")
    if suffix is not None and (not isinstance(suffix, str) or not SUFFIX_RE.fullmatch(suffix)):
        raise VeriError(
            "suffix must be 1 to 64 letters, digits, - or _.", field="suffix", code="invalid_suffix"
        )
    training_file = _file(workspace, body.get("training_file"), param="training_file")
    validation_file = None
    if body.get("validation_file"):
        validation_file = _file(workspace, body["validation_file"], param="validation_file")
    method_name = METHODS[kind]
    for param, file in (("training_file", training_file), ("validation_file", validation_file)):
        if file is not None and (bad := file.dataset.first_bad_line.get(method_name)):
            raise VeriError(
                f"{file.public_id} cannot train {kind}: line {bad['line']} {bad['problem']}.",
                field=param,
                code="invalid_file_format",
            )
    integrations = body.get("integrations") or []
    metadata = _metadata(body.get("metadata"))
    body = body | {"method": method}
    try:
        submission = _submission(
            body=body,
            kind=kind,
            hyperparameters=hyperparameters,
            file=training_file,
        )
        if validation_file is not None:
            submission.validation_dataset_id = validation_file.dataset.public_id
        if integrations:
            submission.integrations = integrations
        with transaction.atomic():
            job = training_jobs.submit_job(workspace=workspace, submission=submission)
            return FineTuningJob.objects.create(
                workspace=workspace,
                model=body["model"],
                method=method,
                training_file=training_file.public_id,
                validation_file=validation_file.public_id if validation_file else "",
                suffix=suffix or "",
                seed=submission.hyperparameters["seed"],
                metadata=metadata,
                integrations=integrations,
                job=job,
                warnings=warnings,
            )
    except VeriError as exc:
        raise _as_openai_param(exc, kind) from None


def get_job(*, workspace: Workspace, job_id: str) -> FineTuningJob:
    found = selectors.jobs_of(workspace=workspace).filter(public_id=job_id).first()
    if found is None:
        raise NotFound(f"No fine-tuning job {job_id[:60]!r}.", field="fine_tuning_job_id")
    return found


def cancel(*, ft: FineTuningJob) -> FineTuningJob:
    """A paused job, or one whose pause is still saving (its run stops now, charged as any
    cancel of a running job), is cancelled for good: no longer paused, so never resumed."""
    if not (ft.paused and ft.job.status == JobStatus.CANCELLED):
        training_jobs.cancel_job(job=ft.job)
    if ft.paused:
        with transaction.atomic():
            if FineTuningJob.objects.filter(pk=ft.pk, paused=True).update(paused=False):
                publish(
                    workspace=ft.workspace,
                    event_type=ENDED[JobStatus.CANCELLED],
                    data={"id": ft.public_id},
                )
    return get_job(workspace=ft.workspace, job_id=ft.public_id)


def pause(*, ft: FineTuningJob) -> FineTuningJob:
    if ft.paused:
        return ft
    with transaction.atomic():
        # The job's row locked and read again: a run that ended since the request read it (its
        # end holds this lock) is not paused, or its model would be hidden for good.
        job = TrainingJob.objects.select_for_update().get(pk=ft.job_id)
        if job.is_terminal:
            raise Conflict(
                f"Fine-tuning job {ft.public_id} is {job.status}; only a running job pauses.",
                code="job_finished",
            )
        FineTuningJob.objects.filter(pk=ft.pk).update(paused=True)
        stops.pause_job(job=job, now=timezone.now())
    return get_job(workspace=ft.workspace, job_id=ft.public_id)


@transaction.atomic
def resume(*, ft: FineTuningJob) -> FineTuningJob:
    """The next Veri job continues from the paused one's newest checkpoint (from the start when
    it was paused before saving one)."""
    # Locked alone: a join would be re-checked against the job a concurrent resume replaced
    # (PostgreSQL), and the waiting resume would find no row.
    ft = FineTuningJob.objects.select_for_update().get(pk=ft.pk)
    if not ft.paused:
        raise Conflict(f"Fine-tuning job {ft.public_id} is not paused.", code="job_not_paused")
    if ft.job.status != JobStatus.CANCELLED:
        raise Conflict(
            f"Fine-tuning job {ft.public_id} is still saving its checkpoint; resume once its "
            "status is paused.",
            code="job_not_paused",
        )
    previous = ft.job
    if previous.checkpoints.filter(final=False).exists():
        job = training_jobs.resume_job(job=previous)
    else:
        job = training_jobs.resubmit_job(job=previous)
    FineTuningJob.objects.filter(pk=ft.pk).update(job=job, paused=False)
    ft.earlier_jobs.add(previous)
    return get_job(workspace=ft.workspace, job_id=ft.public_id)


def _step_metrics(jobs: list[TrainingJob]) -> dict[int, dict]:
    """Every step's values; a resumed run's steps replace the earlier run's same steps."""
    points: dict[int, dict] = {}
    for job in jobs:
        for point in job.metric_points.order_by("step"):
            points[point.step] = point.values
    return points


def ensure_result_file(*, ft: FineTuningJob) -> FineTuningJob:
    """A succeeded job's metrics CSV, written once (the first read after it succeeded)."""
    if ft.result_file_id or ft.job.status != JobStatus.COMPLETED:
        return ft
    with transaction.atomic():
        locked = FineTuningJob.objects.select_for_update().get(pk=ft.pk)
        if locked.result_file_id is None:
            content = objects.results_csv(_step_metrics(selectors.runs(ft=locked)))
            result = files.write_result_file(
                workspace=ft.workspace, filename="step_metrics.csv", content=content
            )
            FineTuningJob.objects.filter(pk=ft.pk).update(result_file=result)
    return get_job(workspace=ft.workspace, job_id=ft.public_id)


def delete_model(*, ft: FineTuningJob) -> None:
    FineTuningJob.objects.filter(pk=ft.pk).update(model_deleted=True)


ENDED = {
    JobStatus.COMPLETED: "fine_tuning.job.succeeded",
    JobStatus.FAILED: "fine_tuning.job.failed",
    JobStatus.CANCELLED: "fine_tuning.job.cancelled",
}


def job_ended(job: TrainingJob) -> None:
    """Training's hook, in the transaction that ended `job`: the face's webhook for the jobs it
    started (a pause ends a run, cancelled, but not the fine-tuning job)."""
    ft = FineTuningJob.objects.filter(job=job).select_related("workspace").first()
    if ft is None:
        return
    if ft.paused:
        if job.status == JobStatus.CANCELLED:
            return  # the pause, as asked: the job waits for its resume
        # The run finished (or failed) before the pause reached it: that is how the job ends.
        FineTuningJob.objects.filter(pk=ft.pk).update(paused=False)
    publish(workspace=ft.workspace, event_type=ENDED[job.status], data={"id": ft.public_id})


def run_grader(*, grader: dict, model_sample: str, item: dict) -> dict:
    """Score one sample as training would (`worker.graders.score`), in a sandboxed child
    process with a time and memory limit: customer code never runs in the API process, and a
    costly metric or template cannot hold it."""
    return graders.run_response(
        grader,
        graders.sample_for(model_sample),
        item,
        timeout=settings.VERI_GRADER_TIMEOUT_SECONDS,
    )


def job_model_name(job: TrainingJob) -> str | None:
    """Training's hook: the `ft:` name of a succeeded job this face started (what its clients
    call), None for a job it did not start."""
    ft = selectors.succeeded_jobs(workspace=job.workspace).filter(job=job).first()
    return objects.fine_tuned_model(ft) if ft else None


def resolve_fine_tuned(*, workspace: Workspace, name: str) -> tuple[str, Checkpoint] | None:
    """Training's hook: a fine-tuned model's name (or one of its checkpoints') as the base it
    was trained on and the checkpoint holding its adapter."""
    found = selectors.find_fine_tuned(workspace=workspace, model=name)
    if found is None:
        return None
    ft, step = found
    checkpoints = Checkpoint.objects.filter(job__in=selectors.runs(ft=ft))
    if step is None:
        checkpoint = checkpoints.filter(final=True).order_by("-pk").first()
    else:
        checkpoint = checkpoints.filter(final=False, step=step).order_by("-pk").first()
    return (ft.job.base_model, checkpoint) if checkpoint else None
