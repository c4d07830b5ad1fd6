"""Submit, the state machine, cancel, resume, and settling a finished job."""

import json
from dataclasses import dataclass, field
from decimal import Decimal

from django.db import transaction
from django.utils import timezone

from providers import catalog
from providers import services as provider_services
from providers.base import ProviderUnavailable
from providers.models import Instance
from providers.services import default_provider, get_adapter, is_usable, usable_providers
from training import errors, hooks, specs
from training.models import TERMINAL, Checkpoint, Dataset, JobEvent, JobStatus, TrainingJob
from training.services import integrations, logs
from veri.errors import Conflict, NotFound, VeriError
from veri.models import Workspace
from veri.queue import enqueue_on_commit
from volumes import selectors as volume_selectors
from volumes import services as volume_services
from volumes.models import Volume
from volumes.services import validate_path, validate_volume_name
from volumes.stores import store_for
from webhooks import services as webhooks

S = JobStatus
NEXT = {  # terminal states have no entry: nothing leaves them
    S.QUEUED: {S.PROVISIONING, S.FAILED, S.CANCELLED},
    S.PROVISIONING: {S.CONFIGURING, S.FAILED, S.CANCELLED},
    S.CONFIGURING: {S.RUNNING, S.FAILED, S.CANCELLED},
    S.RUNNING: {S.COMPLETED, S.FAILED, S.CANCELLED},
}


class InvalidTransition(Conflict):
    code = "invalid_transition"


@transaction.atomic
def transition_job(
    *,
    job_id: int,
    to: JobStatus,
    error_code: str | None = None,
    message: str = "",
    detail: dict | None = None,
) -> TrainingJob:
    """The one way a job changes status: row-locked, so concurrent reports serialize; the event
    and timestamps are written in the same transaction; an illegal move changes nothing."""
    job = TrainingJob.objects.select_for_update().get(pk=job_id)
    if job.status == to:
        return job  # a duplicate report or a retried task
    if to not in NEXT.get(job.status, ()):
        raise InvalidTransition(f"A {job.status} job cannot become {to}.")
    now, previous = timezone.now(), job.status
    job.status = to
    stamp = {
        S.PROVISIONING: "provisioning_at",
        S.CONFIGURING: "configuring_at",
        S.RUNNING: "started_at",
    }.get(to)
    if stamp:
        setattr(job, stamp, now)
    event = {"from": previous, **(detail or {})}
    if to in TERMINAL:
        job.finished_at = now
    if to == S.CANCELLED:
        job.cost_waived = previous != S.RUNNING  # cancelled before running: not charged
    if to == S.FAILED:
        entry = errors.get(error_code)
        job.error_code = entry.code
        job.error_message = message or f"{entry.cause}. {entry.hint}"
        job.error_attribution = errors.attribution_for(entry.code, gpu_count=job.gpu_count)
        event |= {
            "code": job.error_code,
            "attribution": job.error_attribution,
            "message": job.error_message,
        }
    job.save()
    JobEvent.objects.create(job=job, type=to, detail=event)
    if to in TERMINAL:
        hooks.job_ended(job)
        enqueue_on_commit("training.tasks.settle_job", job_id=job.pk)
        data = {"id": job.public_id, "status": job.status, "error": job_error(job)}
        webhooks.publish(workspace=job.workspace, event_type=f"training_job.{to}", data=data)
    return job


def job_error(job: TrainingJob) -> dict | None:
    """A failed job's `{code, message, attribution}`, as the API and webhook events show it."""
    if not job.error_code:
        return None
    return {
        "code": job.error_code,
        "message": job.error_message,
        "attribution": job.error_attribution,
    }


def fail_job(
    *, job_id: int, code: str, message: str = "", detail: dict | None = None
) -> TrainingJob:
    return transition_job(
        job_id=job_id, to=S.FAILED, error_code=code, message=message, detail=detail
    )


def machine_obtained(*, job: TrainingJob) -> TrainingJob:
    """A provider that fulfils requests later (Flex-start) has the machine: billing starts now
    and the job leaves `queued` (idempotent: a later call changes nothing)."""
    with transaction.atomic():
        provider_services.machine_obtained(job=job)
        if job.status == S.QUEUED:
            job = transition_job(job_id=job.pk, to=S.PROVISIONING, detail={"capacity": "obtained"})
    return job


def terminate_instance(*, job: TrainingJob) -> None:
    """Stop the job's machine now (idempotent); cost stops accruing at `terminated_at`."""
    instance = Instance.objects.filter(job=job, terminated_at__isnull=True).first()
    if instance is not None:
        provider_services.terminate_machine(instance=instance)


class JobNotEnded(Conflict):
    code = "job_not_ended"


def release_instance(*, job: TrainingJob) -> None:
    """The machine of an ended job asks to be deleted, its last act: delete it through the
    provider even when settling already did (a provider's delete of a gone machine is a no-op,
    and one that asks is evidently still there), and stop its cost now if nothing had. A job
    still running keeps its machine (409): the watchdog and settle decide its end."""
    job = TrainingJob.objects.get(pk=job.pk)
    if not job.is_terminal:
        raise JobNotEnded(f"A {job.status} job keeps its machine; it is released when it ends.")
    instance = Instance.objects.filter(job=job).first()
    if instance is None or not instance.external_id:
        return
    provider_services.terminate_machine(instance=instance)


def settle_job(*, job_id: int) -> bool:
    """A job reached a terminal state: close it out (machine, cost, log), charge it, credit or
    queue its refund, then stamp `settled_at`. Every step is idempotent, so a rerun (a settle task
    lost with a killed task worker and re-queued by the watchdog) or a concurrent twin changes
    nothing; until the stamp is there the watchdog re-queues it."""
    job = TrainingJob.objects.select_related("workspace").get(pk=job_id)
    if not job.is_terminal:
        return False
    close_out_job(job=job)
    hooks.money().settle(job_id=job.pk)
    TrainingJob.objects.filter(pk=job.pk, settled_at__isnull=True).update(settled_at=timezone.now())
    return True


def close_out_job(*, job: TrainingJob) -> None:
    """For a finished job: terminate its instance, attribute its cost, archive its full log.
    Safe to repeat; each step checks whether it is already done."""
    terminate_instance(job=job)
    hooks.money().attribute_cost(job=job)  # billing's rules, on billing's record
    volume_services.release_pins(holder=job.pin_holder)
    logs.archive_log(job=job, final=True)


@dataclass
class Submission:
    base_model: str
    dataset_id: str
    method: str
    validation_dataset_id: str | None = None
    reward_source: str = ""
    output_name: str = ""
    hyperparameters: dict = field(default_factory=dict)
    lora: dict | None = None
    gpu_type: str = "cpu"
    gpu_count: int = 1
    provider: str | None = None
    region: str | None = None
    volumes: list[str] = field(default_factory=list)
    resume_from: str | None = None
    adapter_from: str | None = None  # a checkpoint's id: train on from its adapter, at step 0
    checkpoint_every: int | None = None
    checkpoint_keep: int = 2
    heartbeat_timeout_seconds: int = 300
    max_launch_attempts: int = 3
    max_cost_usd: object = None  # a number of dollars, or a decimal string
    auto_resume: bool = True
    max_restarts: int = 3
    integrations: list[dict] | None = None


def _check_method(method: str) -> None:
    if method in specs.UNAVAILABLE_METHODS:
        raise VeriError(
            specs.UNAVAILABLE_METHODS[method], field="method", code="method_unavailable"
        )
    if method not in specs.METHODS:
        raise VeriError(
            f"Unknown method {method!r}; use one of: {', '.join(specs.METHODS)}.",
            field="method",
            code="invalid_method",
        )


def _resolve_dataset(
    workspace: Workspace, dataset_id: str, method: str, field: str = "dataset_id"
) -> Dataset:
    """The training (or, with `field="validation_dataset_id"`, validation) dataset: the rows of
    both must fit the method."""
    dataset = Dataset.objects.filter(workspace=workspace, public_id=dataset_id).first()
    if dataset is None:
        raise VeriError(
            f"No dataset {dataset_id!r} in this workspace.", field=field, code="invalid_dataset"
        )
    if bad := dataset.first_bad_line.get(method):
        raise VeriError(
            f"Dataset {dataset.public_id} cannot train {method}: line {bad['line']} "
            f"{bad['problem']}.",
            field=field,
            code="invalid_dataset",
        )
    if dataset.source == Dataset.Source.VOLUME and dataset.volume_id is None:
        raise VeriError(
            f"The volume {dataset.volume_name!r} of dataset {dataset.public_id} was deleted.",
            field=field,
            code="invalid_dataset",
        )
    return dataset


def _resolve_fine_tuned(workspace: Workspace, sub: Submission) -> tuple[str, Checkpoint | None]:
    """The base model and the adapter to train on from: a fine-tuned model's name (`ft:…`, or a
    Tinker save's `tinker://…` path) stands for the base it was trained on with its adapter;
    `adapter_from` names a checkpoint of this workspace directly."""
    base_model = sub.base_model
    if isinstance(base_model, str) and base_model.startswith(hooks.FACE_NAMES):
        found = hooks.fine_tuned_model(workspace=workspace, name=base_model)
        if found is None:
            raise VeriError(
                f"No fine-tuned model or Tinker save {base_model[:200]!r} in this workspace.",
                field="base_model",
                code="invalid_base_model",
            )
        _check_trainable(found[1], name=base_model, field="base_model", code="invalid_base_model")
        return found
    if not sub.adapter_from:
        return base_model, None
    adapter = Checkpoint.objects.filter(workspace=workspace, public_id=sub.adapter_from).first()
    if adapter is None:
        raise VeriError(
            f"No checkpoint {str(sub.adapter_from)[:60]!r} in this workspace.",
            field="adapter_from",
            code="invalid_checkpoint",
        )
    _check_trainable(
        adapter, name=adapter.public_id, field="adapter_from", code="invalid_checkpoint"
    )
    return base_model, adapter


ADAPTER_CONFIG_MAX_BYTES = 1 << 20  # a PEFT config is a few KiB; never read a huge one here


def _check_trainable(adapter: Checkpoint, *, name: str, field: str, code: str) -> None:
    """The trainers compute log-probabilities from the LM head's weight, so they refuse an
    adapter on `lm_head` (a Tinker save whose client trained the unembedding): say so now,
    before anything is rented."""
    store = store_for(adapter.prefix)
    key = next((key for f, key in adapter.file_keys() if f["path"] == "adapter_config.json"), None)
    stored = store.head(key) if key else None
    if stored is None or stored.size > ADAPTER_CONFIG_MAX_BYTES:
        return  # none, or not a PEFT config (a worker wrote it): the worker says what is wrong
    try:
        targets = json.loads(store.get_bytes(key)).get("target_modules") or []
    except (ValueError, AttributeError):  # not a PEFT config: the worker says so
        return
    if "lm_head" in targets:
        raise VeriError(
            f"{name[:200]} is a LoRA of the LM head (lm_head), which the trainers here cannot "
            "train on from. A Tinker save is one when its training client trained the "
            "unembedding: train with train_unembed=False to go on here (it deploys as it is).",
            field=field,
            code=code,
        )


def _check_base_model(base_model: str) -> None:
    """The two forms a base model takes: `volume://<volume>/<path>`, or a model hub id
    (`owner/name`). Never a folder on a machine: a worker loads only what its job may read."""
    if not isinstance(base_model, str) or not base_model:
        raise VeriError(
            "base_model is required (volume://<volume>/<path>, or a Hugging Face repo id).",
            field="base_model",
            code="invalid_base_model",
        )
    if base_model.startswith("volume://"):
        name, _, path = base_model.removeprefix("volume://").partition("/")
        validate_volume_name(name, field="base_model")
        if path:
            validate_path(path.rstrip("/"), field="base_model")
        return
    if not specs.is_hub_id(base_model):
        raise VeriError(
            f"base_model {base_model[:200]!r} is neither volume://<volume>/<path> nor a Hugging "
            "Face repo id like 'Qwen/Qwen2.5-0.5B-Instruct'.",
            field="base_model",
            code="invalid_base_model",
        )


def _check_model_reachable(base_model: str, provider: str) -> None:
    """A hub id or folder the provider's workers cannot load is refused now, not after renting."""
    if base_model.startswith("volume://"):
        return
    if problem := get_adapter(provider).model_problem(base_model):
        raise VeriError(problem, field="base_model", code="base_model_unavailable")


def _resolve_volumes(
    workspace: Workspace, names: list[str], datasets: list[Dataset], base_model: str
) -> list[Volume]:
    """The volumes to mount: those asked for, plus the datasets' and the base model's own."""
    wanted = list(names)
    wanted += [d.volume.public_id for d in datasets if d.source == Dataset.Source.VOLUME]
    if base_model.startswith("volume://"):
        wanted.append(base_model.removeprefix("volume://").split("/", 1)[0])
    mounted: dict[int, Volume] = {}
    for index, ref in enumerate(wanted):
        try:
            volume = volume_selectors.get_volume(workspace=workspace, id_or_name=ref)
        except NotFound:
            field = f"volumes.{index}" if index < len(names) else "base_model"
            raise VeriError(
                f"No volume {ref!r} in this workspace.", field=field, code="invalid_volume"
            ) from None
        mounted[volume.pk] = volume
    if base_model.startswith("volume://"):
        name, _, path = base_model.removeprefix("volume://").partition("/")
        volume = next(v for v in mounted.values() if name in (v.name, v.public_id))
        if not volume_selectors.has_files_under(volume=volume, folder=path):
            raise VeriError(
                f"Volume {volume.name!r} has no files under {path!r}.",
                field="base_model",
                code="invalid_base_model",
            )
    return list(mounted.values())


def _resolve_placement(sub: Submission, volumes: list[Volume]) -> tuple[str, str, catalog.GpuType]:
    provider_name = sub.provider or default_provider()
    spec = catalog.get_provider(provider_name)
    if spec is None:
        names = ", ".join(p.name for p in catalog.providers())
        raise VeriError(
            f"Unknown provider {provider_name!r}; the catalog has: {names}.",
            field="provider",
            code="invalid_provider",
        )
    if not is_usable(provider_name):
        usable = ", ".join(p.name for p in usable_providers())
        raise VeriError(
            f"Provider {provider_name!r} is not configured on this deployment; use "
            f"one of: {usable}.",
            field="provider",
            code="provider_not_configured",
        )
    volume_regions = {v.region for v in volumes}
    region = sub.region or (volume_regions.pop() if len(volume_regions) == 1 else None)
    region = region or catalog.default_region()
    valid = catalog.available_region_codes()
    if region not in valid:
        raise VeriError(
            f"Unknown or not yet available region {region!r}; use one of: {', '.join(valid)}.",
            field="region",
            code="invalid_region",
        )
    if region not in spec.zones:
        raise VeriError(
            f"{provider_name} has no capacity in {region}; it runs in: {', '.join(spec.zones)}.",
            field="region",
            code="invalid_region",
        )
    for volume in volumes:
        if volume.region != region:
            raise VeriError(
                f"Volume {volume.name!r} is in {volume.region}; a job that mounts it "
                f"runs there (region={volume.region}).",
                field="volumes",
                code="volume_region_mismatch",
            )
    gpu = spec.gpu(sub.gpu_type)
    if gpu is None:
        raise VeriError(
            f"{provider_name} offers no gpu_type {sub.gpu_type!r}; it has: "
            f"{', '.join(g.name for g in spec.gpus)}.",
            field="gpu_type",
            code="invalid_gpu_type",
        )
    if not 1 <= sub.gpu_count <= gpu.max_count:
        raise VeriError(
            f"gpu_count for {gpu.name} on {provider_name} is 1 to {gpu.max_count}.",
            field="gpu_count",
            code="invalid_gpu_count",
        )
    return provider_name, region, gpu


def _resolve_checkpoint(workspace: Workspace, checkpoint_id: str | None, method: str):
    if not checkpoint_id:
        return None
    checkpoint = (
        Checkpoint.objects.select_related("job")
        .filter(workspace=workspace, public_id=checkpoint_id)
        .first()
    )
    # A face's name for a fine-tuned model (`tinker://…`, `ft:…`) names its checkpoint too.
    if checkpoint is None and (
        found := hooks.fine_tuned_model(workspace=workspace, name=checkpoint_id)
    ):
        checkpoint = found[1]
    if checkpoint is None:
        raise VeriError(
            f"No checkpoint {checkpoint_id!r} in this workspace.",
            field="resume_from",
            code="invalid_checkpoint",
        )
    if checkpoint.job is None:  # its optimizer state is the face's own, not a trainer's
        raise VeriError(
            f"Checkpoint {checkpoint_id} was saved by a Tinker training client, not by a job: "
            "a job cannot resume its optimizer. Train on from its adapter with base_model set "
            "to its tinker:// path.",
            field="resume_from",
            code="invalid_checkpoint",
        )
    if checkpoint.job.method != method:
        raise VeriError(
            f"Checkpoint {checkpoint_id} is from a {checkpoint.job.method} job; resume "
            f"it with method={checkpoint.job.method}.",
            field="resume_from",
            code="invalid_checkpoint",
        )
    return checkpoint


@dataclass(frozen=True)
class Plan:
    """A submission that passed every check: what the job would be, before any money moves."""

    sub: Submission
    hyperparameters: dict
    lora: dict
    dataset: Dataset
    validation_dataset: Dataset | None
    volumes: list[Volume]
    provider: str
    region: str
    gpu: catalog.GpuType
    checkpoint: Checkpoint | None
    base_model: str  # a fine-tuned model's name resolved to the base it was trained on
    adapter: Checkpoint | None
    max_cost_micros: int | None
    integrations: list[dict]

    @property
    def price_per_hour_micros(self) -> int:
        return self.gpu.price_per_gpu_hour_micros * self.sub.gpu_count


MAX_COST_USD = Decimal(1_000_000)


def _max_cost_micros(value) -> int | None:
    if value is None:
        return None
    try:
        amount = Decimal(str(value))
    except ArithmeticError:
        amount = Decimal(-1)
    if isinstance(value, bool) or not amount.is_finite() or not 0 < amount <= MAX_COST_USD:
        raise VeriError(
            f"max_cost_usd must be a number of dollars above 0 and at most {MAX_COST_USD}.",
            field="max_cost_usd",
        )
    return int(amount * 1_000_000)


def plan_job(*, workspace: Workspace, submission: Submission) -> Plan:
    """Validate everything a worker would trip on later (and the job's placement and price),
    renting and writing nothing: what submit and quote share."""
    sub = submission
    hooks.money().check_account(workspace=workspace)
    _check_method(sub.method)
    base_model, adapter = _resolve_fine_tuned(workspace, sub)
    _check_base_model(base_model)
    if sub.method == "grpo":
        specs.check_reward_source(sub.reward_source)
    hyperparameters = specs.validate_hyperparameters(sub.method, sub.hyperparameters)
    lora = specs.validate_lora(sub.lora, gpu_type=sub.gpu_type)
    dataset = _resolve_dataset(workspace, sub.dataset_id, sub.method)
    validation = None
    if sub.validation_dataset_id:
        validation = _resolve_dataset(
            workspace, sub.validation_dataset_id, sub.method, field="validation_dataset_id"
        )
    datasets = [dataset, validation] if validation else [dataset]
    volumes = _resolve_volumes(workspace, sub.volumes, datasets, base_model)
    provider, region, gpu = _resolve_placement(sub, volumes)
    _check_model_reachable(base_model, provider)
    checkpoint = _resolve_checkpoint(workspace, sub.resume_from, sub.method)
    if checkpoint and adapter:
        raise VeriError(
            "resume_from continues a run with its own adapter; give it or a fine-tuned model to "
            "train on, not both.",
            field="resume_from",
            code="invalid_checkpoint",
        )
    checked_integrations = integrations.validate_integrations(sub.integrations, workspace=workspace)
    limits = [
        ("checkpoint_every", sub.checkpoint_every, 1, 1_000_000),
        ("checkpoint_keep", sub.checkpoint_keep, 1, 50),
        ("heartbeat_timeout_seconds", sub.heartbeat_timeout_seconds, 30, 86_400),
        ("max_launch_attempts", sub.max_launch_attempts, 1, 20),
        ("max_restarts", sub.max_restarts, 0, 10),
    ]
    for name, value, low, high in limits:
        if value is not None and not low <= value <= high:
            raise VeriError(f"{name} must be from {low} to {high}.", field=name)
    return Plan(
        sub=sub,
        hyperparameters=hyperparameters,
        lora=lora,
        dataset=dataset,
        validation_dataset=validation,
        volumes=volumes,
        provider=provider,
        region=region,
        gpu=gpu,
        checkpoint=checkpoint,
        base_model=base_model,
        adapter=adapter,
        max_cost_micros=_max_cost_micros(sub.max_cost_usd),
        integrations=checked_integrations,
    )


def submit_job(*, workspace: Workspace, submission: Submission) -> TrainingJob:
    """Plan the job, check the balance covers its first hour, write it queued, queue its launch."""
    plan = plan_job(workspace=workspace, submission=submission)
    sub = plan.sub
    with transaction.atomic():
        # Billing locks the workspace's account row until this commits: concurrent submits
        # are checked one after another, each seeing the jobs the earlier ones wrote.
        hooks.money().require_funds(
            workspace=workspace, first_hour_micros=plan.price_per_hour_micros
        )
        job = TrainingJob.objects.create(
            workspace=workspace,
            method=sub.method,
            base_model=plan.base_model,
            dataset=plan.dataset,
            validation_dataset=plan.validation_dataset,
            reward_source=sub.reward_source if sub.method == "grpo" else "",
            output_name=sub.output_name,
            hyperparameters=plan.hyperparameters,
            lora=plan.lora,
            volumes=[{"id": v.public_id, "name": v.name} for v in plan.volumes],
            resume_from=plan.checkpoint,
            adapter_from=plan.adapter,
            provider=plan.provider,
            region=plan.region,
            gpu_type=sub.gpu_type,
            gpu_count=sub.gpu_count,
            checkpoint_every=sub.checkpoint_every,
            checkpoint_keep=sub.checkpoint_keep,
            heartbeat_timeout_seconds=sub.heartbeat_timeout_seconds,
            max_launch_attempts=sub.max_launch_attempts,
            max_cost_micros=plan.max_cost_micros,
            auto_resume=sub.auto_resume,
            max_restarts=sub.max_restarts,
            integrations=plan.integrations,
        )
        # Every run of the job, a restarted one too, syncs the volumes as they are now.
        job.inputs_digest = volume_services.pin_files(holder=job.pin_holder, volumes=plan.volumes)
        job.save(update_fields=["inputs_digest"])
        JobEvent.objects.create(
            job=job,
            type=S.QUEUED,
            detail={"provider": plan.provider, "region": plan.region, "gpu_type": sub.gpu_type},
        )
        enqueue_on_commit("training.tasks.provision_job", job_id=job.pk)
    return job


def cancel_job(*, job: TrainingJob) -> TrainingJob:
    """Immediate: the instance is terminated before this returns. Cancelling a finished job
    answers 409; cancelling a cancelled one returns it unchanged, once its machine is stopped
    (a provider that could not be reached is 503; asking again tries to stop it again)."""
    if job.status == S.CANCELLED and job.settled_at is not None:
        return job
    if job.is_terminal and job.status != S.CANCELLED:
        raise Conflict(f"Job {job.public_id} already {job.status}.", code="job_finished")
    if job.status != S.CANCELLED:
        job = transition_job(job_id=job.pk, to=S.CANCELLED, detail={"by": "customer"})
    try:
        settle_job(job_id=job.pk)  # again on a retry: a machine the provider kept is stopped now
    except ProviderUnavailable as exc:
        raise ProviderUnavailable(
            f"Job {job.public_id}'s machine could not be stopped: {exc.message}. Retry the "
            "cancel in a moment."
        ) from exc
    job.refresh_from_db()
    return job


def resume_job(*, job: TrainingJob, checkpoint_id: str | None = None) -> TrainingJob:
    """A new job with the same spec that continues from the newest (or given) checkpoint."""
    checkpoints = Checkpoint.objects.filter(job=job)
    if checkpoint_id:
        checkpoint = checkpoints.filter(public_id=checkpoint_id).first()
        if checkpoint is None:
            raise VeriError(
                f"Job {job.public_id} has no checkpoint {checkpoint_id!r}.",
                field="checkpoint_id",
                code="invalid_checkpoint",
            )
    else:
        checkpoint = checkpoints.order_by("-step", "final").first()
        if checkpoint is None:
            raise VeriError(
                f"Job {job.public_id} saved no checkpoint to resume from: "
                + _why_no_checkpoint(job),
                field="checkpoint_id",
                code="no_checkpoint",
            )
    max_steps = job.hyperparameters.get("max_steps")
    if max_steps is not None and checkpoint.step >= max_steps:
        raise VeriError(
            f"Checkpoint {checkpoint.public_id} is at step {checkpoint.step}, the job's max_steps: "
            "there is nothing left to train. Submit a new job with resume_from and a higher "
            "max_steps to train further.",
            field="checkpoint_id",
            code="nothing_to_resume",
        )
    return submit_job(workspace=job.workspace, submission=_again(job, checkpoint=checkpoint))


def _why_no_checkpoint(job: TrainingJob) -> str:
    """The end of `no_checkpoint`'s message: what to change, which depends on why."""
    if not job.checkpoint_every:
        return "set checkpoint_every when submitting."
    step = f"step {job.last_step}" if job.last_step else "its first step"
    if job.status == S.CANCELLED:
        return (
            f"it was cancelled at {step}, before its first checkpoint "
            f"(every {job.checkpoint_every} steps). Submit it again."
        )
    if job.is_terminal:
        return (
            f"it ended at {step}, before its first checkpoint (every {job.checkpoint_every} "
            "steps). Submit it again."
        )
    return f"it has not reached its first checkpoint (every {job.checkpoint_every} steps) yet."


def resubmit_job(*, job: TrainingJob) -> TrainingJob:
    """A new job with the same spec, from where it started (a job that ended before saving
    anything)."""
    return submit_job(workspace=job.workspace, submission=submission_of(job))


def submission_of(job: TrainingJob) -> Submission:
    """What submitting this job again would send: its spec as it was submitted (defaults filled
    in), from the checkpoint it was resumed from, if any."""
    return _again(job, checkpoint=job.resume_from)


def _again(job: TrainingJob, *, checkpoint: Checkpoint | None) -> Submission:
    return Submission(
        base_model=job.base_model,
        dataset_id=job.dataset.public_id,
        validation_dataset_id=job.validation_dataset.public_id if job.validation_dataset else None,
        method=job.method,
        reward_source=job.reward_source,
        output_name=job.output_name,
        hyperparameters=dict(job.hyperparameters),
        lora=job.lora,
        gpu_type=job.gpu_type,
        gpu_count=job.gpu_count,
        provider=job.provider,
        region=job.region,
        volumes=[v["id"] for v in job.volumes],
        resume_from=checkpoint.public_id if checkpoint else None,
        adapter_from=job.adapter_from.public_id if job.adapter_from and not checkpoint else None,
        checkpoint_every=job.checkpoint_every,
        checkpoint_keep=job.checkpoint_keep,
        heartbeat_timeout_seconds=job.heartbeat_timeout_seconds,
        max_launch_attempts=job.max_launch_attempts,
        max_cost_usd=None if job.max_cost_micros is None else Decimal(job.max_cost_micros) / 10**6,
        auto_resume=job.auto_resume,
        max_restarts=job.max_restarts,
        integrations=job.integrations,
    )
