"""Saves: `save_state` (a model's LoRA weights and AdamW state) saved by its worker into the
workspace's `tinker/<checkpoint>/` folder (presigned PUTs), addressed by the client as
`tinker://<model_id>/weights/<name>` and loaded back by any model of the workspace; and a named
`save_weights_for_sampler` (its LoRA weights), uploaded the same way into
`tinker/<its request id>/`, addressed as `tinker://<model_id>/sampler_weights/<name>`
(tinker_api.services.sampling samples from it). Each one's LoRA adapter is also a Veri
checkpoint: its path names it to deployments and managed jobs, and both kinds are listed,
downloaded and deleted alike."""

import re
import tarfile

from django.conf import settings
from django.db import transaction

from tinker_api.models import (
    CheckpointKind,
    OpKind,
    OpStatus,
    TinkerCheckpoint,
    TinkerModel,
    TinkerOperation,
)
from tinker_api.services import sessions
from training.models import Checkpoint
from veri.errors import NotFound, VeriError
from veri.models import Workspace
from volumes.stores import keys, store_for

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
MAX_FILES = 20


def tinker_path(checkpoint: TinkerCheckpoint) -> str:
    return f"tinker://{checkpoint.model.model_id}/{checkpoint.kind}/{checkpoint.name}"


def folder(checkpoint: TinkerCheckpoint) -> str:
    """Its folder under the workspace's prefix: a sampler save's is named after its request, as
    it was before sampler saves were checkpoints."""
    if checkpoint.kind == CheckpointKind.SAMPLER:
        return f"tinker/{checkpoint.operation.request_id}"
    return f"tinker/{checkpoint.public_id}"


def _prefix(checkpoint: TinkerCheckpoint) -> keys.Prefix:
    return keys.workspace_prefix(checkpoint.workspace.public_id).child(folder(checkpoint))


def record(*, operation: TinkerOperation, name: str, kind: CheckpointKind) -> None:
    """The save `operation` will make (its files once its worker uploaded them)."""
    model = operation.model
    TinkerCheckpoint.objects.get_or_create(
        operation=operation,
        defaults={"model": model, "workspace": model.workspace, "name": name, "kind": kind},
    )


def save(*, model: TinkerModel, seq_id: int, name: str | None) -> TinkerOperation:
    name = name or f"step-{seq_id:06d}"
    if not NAME_RE.fullmatch(name):
        raise VeriError(
            "A checkpoint's name is letters, digits, '.', '_' and '-' (up to 100).", field="path"
        )
    operation = sessions.enqueue(
        model=model, seq_id=seq_id, kind=OpKind.SAVE_WEIGHTS, payload={"name": name}
    )
    record(operation=operation, name=name, kind=CheckpointKind.STATE)
    return operation


def resolve(
    *, workspace: Workspace, path: str, kinds: tuple[str, ...] = (CheckpointKind.STATE,)
) -> TinkerCheckpoint:
    """The save `tinker://<model_id>/<kind>/<name>` of this workspace, of one of `kinds` (the
    newest of that name)."""
    run, _, rest = path.removeprefix("tinker://").partition("/")
    kind, _, name = rest.partition("/")
    checkpoint = None
    if path.startswith("tinker://") and kind in kinds:
        checkpoint = (
            TinkerCheckpoint.objects.filter(
                workspace=workspace, model__model_id=run, kind=kind, name=name, files__isnull=False
            )
            .select_related("model", "workspace", "operation")
            .order_by("-created_at", "-pk")
            .first()
        )
    if checkpoint is None:
        raise NotFound(f"No checkpoint {path} in this workspace.")
    return checkpoint


def presigned_gets(prefix: keys.Prefix, files: list[dict]) -> list[dict]:
    """What a worker fetches: each saved file with a presigned GET."""
    store, ttl = store_for(prefix), settings.VERI_PRESIGN_TTL_SECONDS
    return [
        {"path": f["path"], "url": store.presign_get(prefix.key(f["path"]), expires=ttl)}
        for f in files
    ]


def load_payload(checkpoint: TinkerCheckpoint, *, optimizer: bool) -> dict:
    """What a worker loads: the checkpoint's files (presigned GETs)."""
    files = presigned_gets(_prefix(checkpoint), checkpoint.files)
    return {"path": tinker_path(checkpoint), "files": files, "optimizer": optimizer}


def loadable(*, workspace: Workspace, path: str, optimizer: bool) -> TinkerCheckpoint:
    """The save `path` names, for a load: sampler weights hold no optimizer state."""
    checkpoint = resolve(workspace=workspace, path=path, kinds=tuple(CheckpointKind))
    if optimizer and checkpoint.kind == CheckpointKind.SAMPLER:
        raise VeriError(
            f"{path} holds LoRA weights only, no optimizer state: load it without the "
            "optimizer (load_state, create_training_client_from_state), or save with "
            "save_state to keep the optimizer.",
            field="path",
        )
    return checkpoint


def load(*, model: TinkerModel, seq_id: int, path: str, optimizer: bool) -> TinkerOperation:
    checkpoint = loadable(workspace=model.workspace, path=path, optimizer=optimizer)
    payload = load_payload(checkpoint, optimizer=optimizer)
    return sessions.enqueue(model=model, seq_id=seq_id, kind=OpKind.LOAD_WEIGHTS, payload=payload)


def _running_save_prefix(model: TinkerModel, request_id: str) -> keys.Prefix:
    """The folder of the model's running save `request_id` (a `save_state`, or a named sampler
    save)."""
    checkpoint = (
        TinkerCheckpoint.objects.filter(
            model=model,
            operation__request_id=request_id,
            operation__status=OpStatus.RUNNING,
        )
        .select_related("workspace", "operation")
        .first()
    )
    if checkpoint is None:
        raise NotFound(f"No save {request_id} running for this model.")
    return _prefix(checkpoint)


def upload_urls(*, model: TinkerModel, request_id: str, files: list[dict]) -> list[dict]:
    """Presigned PUTs for a running save's files, inside its own folder only."""
    prefix = _running_save_prefix(model, request_id)
    if not 0 < len(files) <= MAX_FILES:
        raise VeriError(f"A checkpoint has 1 to {MAX_FILES} files.", field="files")
    store, ttl = store_for(prefix), settings.VERI_PRESIGN_TTL_SECONDS
    answer = []
    for file in files:
        url, headers = store.presign_put(prefix.key(file["path"]), expires=ttl)
        answer.append({"path": file["path"], "url": url, "headers": headers})
    return answer


def saved_files(prefix: keys.Prefix, files: list[dict]) -> list[dict]:
    """The files a worker says it uploaded, each inside `prefix` (else refused)."""
    for file in files:
        prefix.key(file["path"])  # refuses a path outside the folder
    return [{"path": f["path"], "size": int(f["size"])} for f in files]


def complete(*, operation: TinkerOperation, files: list[dict]) -> dict:
    """The save's files are uploaded: the checkpoint can be loaded. Its operation's result."""
    checkpoint = TinkerCheckpoint.objects.select_related("model", "workspace", "operation").get(
        operation=operation
    )
    checkpoint.files = saved_files(_prefix(checkpoint), files)
    checkpoint.save(update_fields=["files"])
    as_veri_checkpoint(checkpoint)
    return {"type": operation.kind, "path": tinker_path(checkpoint)}


@transaction.atomic
def as_veri_checkpoint(checkpoint: TinkerCheckpoint) -> Checkpoint:
    """The save's LoRA adapter as a Veri checkpoint on the same files (the optimizer's state is
    left out: only `load_state` reads it), made once. Its step is the optimizer steps the model
    had taken when it saved."""
    checkpoint = TinkerCheckpoint.objects.select_for_update().get(pk=checkpoint.pk)
    if checkpoint.checkpoint_id is None:  # also a save completed before saves were recorded
        adapter = [f for f in checkpoint.files if f["path"].startswith(ARCHIVE_PREFIX)]
        steps = checkpoint.model.operations.filter(
            kind=OpKind.OPTIM_STEP, status=OpStatus.DONE, seq_id__lt=checkpoint.operation.seq_id
        )
        checkpoint.checkpoint = Checkpoint.objects.create(
            workspace=checkpoint.workspace,
            base_model=checkpoint.model.base_model,
            folder=folder(checkpoint),
            step=steps.count(),
            final=False,
            files=adapter,
            size_bytes=sum(f["size"] for f in adapter),
        )
        checkpoint.save(update_fields=["checkpoint"])
    return checkpoint.checkpoint


def adapter_name(checkpoint: TinkerCheckpoint) -> str:
    """The name a deployment serves the save's adapter under: its `tinker://` path, or its Veri
    checkpoint's id when a newer save of the model took that name."""
    path = tinker_path(checkpoint)
    if resolve(workspace=checkpoint.workspace, path=path, kinds=(checkpoint.kind,)) == checkpoint:
        return path
    return as_veri_checkpoint(checkpoint).public_id


def resolve_adapter(*, workspace: Workspace, name: str) -> tuple[str, Checkpoint] | None:
    """Training's hook: a saved state's `tinker://` path as the base model it was trained on and
    the Veri checkpoint of its adapter; None for a name that is not such a path."""
    if not name.startswith("tinker://"):
        return None
    try:
        saved = resolve(workspace=workspace, path=name, kinds=tuple(CheckpointKind))
    except NotFound:
        return None
    checkpoint = as_veri_checkpoint(saved)
    return checkpoint.base_model, checkpoint


ARCHIVE_PREFIX = "adapter_"  # PEFT's files (adapter_config.json, adapter_model.safetensors)


def _archive_key(checkpoint: TinkerCheckpoint) -> str:
    # Beside the checkpoint's folder, not in it: a save's upload URLs cannot reach it.
    return keys.workspace_prefix(checkpoint.workspace.public_id).key(
        f"tinker/{checkpoint.public_id}.tar"
    )


def _tar(store, checkpoint: TinkerCheckpoint):
    """The adapter's files as one tar stream, `<name>/adapter_…`: a folder PEFT loads."""
    prefix = _prefix(checkpoint)
    for file in checkpoint.files:
        if not file["path"].startswith(ARCHIVE_PREFIX):
            continue  # the optimizer's state is for load_state, not for an adapter
        key = prefix.key(file["path"])
        stored = store.head(key)
        if stored is None:
            raise NotFound(f"{tinker_path(checkpoint)} lost its file {file['path']}.")
        info = tarfile.TarInfo(f"{checkpoint.name}/{file['path']}")
        info.size, info.mode = stored.size, 0o644
        info.mtime = int(checkpoint.created_at.timestamp())
        yield info.tobuf(format=tarfile.PAX_FORMAT)
        yield from store.iter_bytes(key)
        yield b"\0" * (-stored.size % tarfile.BLOCKSIZE)
    yield b"\0" * (2 * tarfile.BLOCKSIZE)


def archive_url(checkpoint: TinkerCheckpoint) -> str:
    """A short-lived download URL of the checkpoint's LoRA adapter as a tar archive, written to
    the store the first time it is asked for (a checkpoint never changes once saved)."""
    key = _archive_key(checkpoint)
    store = store_for(keys.workspace_prefix(checkpoint.workspace.public_id))
    if store.head(key) is None:
        store.put_stream(key, _tar(store, checkpoint))
    return store.presign_get(key, expires=settings.VERI_PRESIGN_TTL_SECONDS)


def delete(checkpoint: TinkerCheckpoint) -> None:
    """The checkpoint, its files and its archive: `tinker://…` no longer resolves to it."""
    store = store_for(keys.workspace_prefix(checkpoint.workspace.public_id))
    store.delete_prefix(_prefix(checkpoint))
    store.delete([_archive_key(checkpoint)])
    Checkpoint.objects.filter(tinker_save=checkpoint).delete()
    checkpoint.delete()
