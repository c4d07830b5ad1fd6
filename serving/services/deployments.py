"""Create, update and delete deployments (their states change in `states`)."""

from dataclasses import dataclass

from django.conf import settings
from django.db import transaction

from providers import catalog
from providers.services import get_adapter, is_usable
from serving import hooks, selectors
from serving.models import REPLICA_LIVE, Deployment, DeploymentStatus
from serving.services import replicas, states
from training import hooks as training_hooks
from training.models import Checkpoint, JobStatus, TrainingJob
from veri.errors import Conflict, VeriError
from veri.models import Workspace
from volumes import selectors as volume_selectors
from volumes import services as volume_services

S = DeploymentStatus
MAX_ADAPTERS = 16
MAX_REPLICAS = 8
DEFAULT_PROVIDER = "local"  # the embedded default: the worker's CPU engine on this machine
ADAPTER_FILE = "adapter_config.json"  # a checkpoint with it is a LoRA adapter a replica loads
JOB_PREFIX = "job_"  # a training job's id: deploying it deploys its trained adapter


@dataclass(frozen=True, slots=True)
class Shape:
    gpu_type: str | None = None
    gpu_count: int = 1
    provider: str | None = None
    region: str | None = None
    min_replicas: int = 0
    max_replicas: int = 1
    idle_timeout_seconds: int = 900


def deployable_name(job: TrainingJob) -> str | None:
    """The name a succeeded job's adapter is deployed under: its face's model name when a face
    started it (the `ft:` model its clients call), else its final checkpoint's id; None when the
    job left no adapter to serve."""
    if job.status != JobStatus.COMPLETED:
        return None
    final = job.checkpoints.filter(final=True).first()
    if final is None or all(f["path"] != ADAPTER_FILE for f in final.files):
        return None
    return training_hooks.job_model_name(job) or final.public_id


def _job_adapter(*, workspace: Workspace, job_id: str, field: str) -> str:
    """A training job's id as the name of the adapter it trained."""
    job = TrainingJob.objects.filter(workspace=workspace, public_id=job_id).first()
    if job is None:
        raise VeriError(
            f"{job_id[:200]!r} is not a training job of this workspace. Deploy one of its jobs, "
            "an ft: model or a checkpoint id (veri jobs list; veri checkpoints list JOB_ID).",
            field=field,
            code="model_not_found",
        )
    name = deployable_name(job)
    if name is None:
        raise VeriError(
            f"{job_id} has no trained adapter to deploy (it is {job.status}; a completed job's "
            "final checkpoint is deployed).",
            field=field,
            code="model_not_found",
        )
    return name


def resolve_adapter(*, workspace: Workspace, name: str, field: str) -> tuple[str, Checkpoint]:
    """An adapter's name (a face's name for it, as an `ft:` model or a `tinker://` path of this
    workspace, or a checkpoint id) as the base it was trained on and the checkpoint holding it."""
    found = training_hooks.fine_tuned_model(workspace=workspace, name=name)
    if found is None:
        checkpoint = (
            Checkpoint.objects.filter(workspace=workspace, public_id=name)
            .select_related("job", "workspace")
            .first()
        )
        found = checkpoint and (checkpoint.adapter_base, checkpoint)
    if not found:
        raise VeriError(
            f"{name[:200]!r} is not a fine-tuned model, a Tinker save nor a checkpoint of this "
            "workspace.",
            field=field,
            code="model_not_found",
        )
    return found


def _adapters(*, workspace: Workspace, base_model: str | None, names: list[str]) -> tuple:
    if len(names) > MAX_ADAPTERS:
        raise VeriError(f"At most {MAX_ADAPTERS} adapters per deployment.", field="adapters")
    if len(set(names)) != len(names):
        raise VeriError("An adapter is named twice.", field="adapters")
    adapters = []
    for index, name in enumerate(names):
        if name.startswith(JOB_PREFIX):
            name = _job_adapter(workspace=workspace, job_id=name, field=f"adapters.{index}")
        base, checkpoint = resolve_adapter(
            workspace=workspace, name=name, field=f"adapters.{index}"
        )
        base_model = base_model or base
        if base != base_model:
            raise VeriError(
                f"{name} was trained on {base}, not on the deployment's base {base_model}.",
                field=f"adapters.{index}",
                code="adapter_base_mismatch",
            )
        adapters.append({"name": name, "checkpoint_id": checkpoint.public_id})
    if not base_model:
        raise VeriError("base_model is required when no adapter is given.", field="base_model")
    return base_model, adapters


def _check_shape(shape: Shape) -> None:
    if not 0 <= shape.min_replicas <= shape.max_replicas <= MAX_REPLICAS or shape.max_replicas < 1:
        raise VeriError(
            f"0 <= min_replicas <= max_replicas, 1 <= max_replicas <= {MAX_REPLICAS}.",
            field="min_replicas",
        )
    if not 10 <= shape.idle_timeout_seconds <= 7 * 86400:
        raise VeriError("idle_timeout_seconds is 10 to 604800.", field="idle_timeout_seconds")


def _placement(shape: Shape) -> tuple[str, str, str]:
    provider = shape.provider or DEFAULT_PROVIDER
    spec = catalog.get_provider(provider)
    if spec is None or not is_usable(provider):
        raise VeriError(f"Provider {provider!r} is not offered here.", field="provider")
    if not get_adapter(provider).serves_replicas:  # its machine's port cannot be opened yet
        raise VeriError(
            f"Deployments do not run on {provider} yet: the control plane could not reach a "
            "replica there (see docs/user-guide/serving.md for the providers that serve).",
            field="provider",
            code="provider_not_supported",
        )
    gpu_type = shape.gpu_type or settings.VERI_SERVING_GPU_TYPE
    if spec.gpu(gpu_type) is None:
        raise VeriError(f"{provider} has no GPU type {gpu_type!r}.", field="gpu_type")
    region = shape.region or settings.VERI_DEFAULT_REGION
    if region not in spec.zones:
        raise VeriError(f"{provider} does not run in region {region!r}.", field="region")
    return provider, gpu_type, region


def _check_base_loadable(base_model: str, provider: str) -> None:
    """A hub id the provider's replicas cannot load is refused now, not when a replica fails."""
    if base_model.startswith("volume://"):
        return
    if problem := get_adapter(provider).model_problem(base_model):
        raise VeriError(problem, field="base_model", code="base_model_unavailable")


def _check_not_deployed(workspace: Workspace, names: list[str]) -> None:
    """A name a live deployment already serves is not deployed twice: both would bill while
    the router sends its requests to one."""
    for name in names:
        existing = selectors.serving(workspace=workspace, model=name)
        if existing is not None and existing.status != S.FAILED:
            raise Conflict(
                f"{name} is already deployed as {existing.public_id}; call it, change that "
                "deployment, or delete it before deploying again.",
                code="already_deployed",
                deployment_id=existing.public_id,
            )


def _pin_base(deployment: Deployment) -> None:
    """A base model in a volume is pinned as it is now, as a job's inputs are: every replica
    loads these files, whatever is uploaded over them later."""
    if not deployment.base_model.startswith("volume://"):
        return
    name, _, path = deployment.base_model.removeprefix("volume://").partition("/")
    volume = volume_selectors.get_volume(workspace=deployment.workspace, id_or_name=name)
    if not volume_selectors.has_files_under(volume=volume, folder=path):
        raise VeriError(f"No files under {deployment.base_model}.", field="base_model")
    volume_services.pin_files(holder=deployment.pin_holder, volumes=[volume])


@transaction.atomic
def create_deployment(
    *, workspace: Workspace, base_model: str | None, adapters: list[str], shape: Shape
) -> Deployment:
    """A deployment of `base_model` (or the base its adapters were trained on), whose first
    replica starts at once; it scales to `min_replicas` after `idle_timeout_seconds`."""
    _check_shape(shape)
    provider, gpu_type, region = _placement(shape)
    # A job's id, an `ft:` model or a `tinker://` path names an adapter, served on its base.
    if base_model and base_model.startswith((JOB_PREFIX, *training_hooks.FACE_NAMES)):
        base_model, adapters = None, [base_model, *adapters]
    base_model, resolved = _adapters(workspace=workspace, base_model=base_model, names=adapters)
    _check_base_loadable(base_model, provider)
    Workspace.objects.select_for_update().get(pk=workspace.pk)  # one create at a time: no twins
    _check_not_deployed(workspace, [a["name"] for a in resolved] or [base_model])
    hooks.require_funds(workspace=workspace, deploying=True)  # its first replica starts now
    deployment = Deployment.objects.create(
        workspace=workspace,
        base_model=base_model,
        adapters=resolved,
        gpu_type=gpu_type,
        gpu_count=shape.gpu_count,
        provider=provider,
        region=region,
        min_replicas=shape.min_replicas,
        max_replicas=shape.max_replicas,
        idle_timeout_seconds=shape.idle_timeout_seconds,
    )
    _pin_base(deployment)
    states.record_event(deployment=deployment, type="created", detail={"adapters": resolved})
    replicas.start_replica(deployment=deployment)
    deployment.refresh_from_db()  # now starting
    return deployment


@transaction.atomic
def update_deployment(
    *, deployment: Deployment, adapters: list[str] | None, changes: dict
) -> Deployment:
    """New replica bounds or idle timeout apply at once; new adapters reach the replicas started
    from now on (a running replica keeps the adapters it loaded until it stops)."""
    deployment = Deployment.objects.select_for_update().get(pk=deployment.pk)
    if deployment.status == S.FAILED:
        raise Conflict("A failed deployment cannot change; delete it and deploy again.")
    shape = Shape(
        min_replicas=changes.get("min_replicas", deployment.min_replicas),
        max_replicas=changes.get("max_replicas", deployment.max_replicas),
        idle_timeout_seconds=changes.get("idle_timeout_seconds", deployment.idle_timeout_seconds),
    )
    _check_shape(shape)
    fields = {k: getattr(shape, k) for k in changes}
    if adapters is not None:
        _, deployment.adapters = _adapters(
            workspace=deployment.workspace, base_model=deployment.base_model, names=adapters
        )
        fields["adapters"] = deployment.adapters
    for name, value in fields.items():
        setattr(deployment, name, value)
    deployment.save()
    states.record_event(deployment=deployment, type="updated", detail=fields)
    if deployment.min_replicas and not deployment.replicas.filter(status__in=REPLICA_LIVE):
        hooks.require_funds(workspace=deployment.workspace, deploying=True)
        replicas.start_replica(deployment=deployment)
        deployment.refresh_from_db()
    return deployment


def delete_deployment(*, deployment: Deployment) -> None:
    """Stop every replica (its machine terminated) and forget the deployment."""
    replicas.stop_replicas(deployment=deployment, reason="deleted")
    volume_services.release_pins(holder=deployment.pin_holder)
    deployment.delete()
