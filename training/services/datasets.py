import hashlib
import io
import json

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import ProtectedError

from training import specs
from training.models import Dataset, TrainingJob
from training.specs import scan_jsonl
from veri.errors import Conflict, TooLarge, VeriError
from veri.models import Workspace, make_public_id
from veri.queue import enqueue_on_commit
from volumes import selectors as volume_selectors
from volumes.services import schedule_store_deletion, validate_path
from volumes.stores import keys, store_for

PREVIEW_ROWS, PREVIEW_MAX_ROWS = 5, 50
# A preview reads at most this much of the file: a volume file may be one endless line.
PREVIEW_MAX_BYTES = 1024 * 1024


def create_uploaded_dataset(*, workspace: Workspace, file, name: str = "") -> tuple[Dataset, bool]:
    """A small `.jsonl` dataset kept in the object store; its rows are checked once, here.

    The same bytes uploaded again into the workspace are the dataset already made of them (its
    name kept): returns (dataset, created)."""
    if file.size > settings.VERI_DATASET_MAX_BYTES:
        raise TooLarge(
            f"The file is {file.size} bytes; uploaded datasets are limited to "
            f"{settings.VERI_DATASET_MAX_BYTES} bytes. Put larger data in a volume and use "
            "Dataset.from_volume.",
            field="file",
            code="dataset_too_large",
        )
    if not (file.name or "").endswith(".jsonl"):
        raise VeriError(
            "Upload a .jsonl file (one JSON object per line).", field="file", code="invalid_dataset"
        )
    data = file.read()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise VeriError(
            "The file is not UTF-8 text.", field="file", code="invalid_dataset"
        ) from None
    row_count, first_bad = scan_jsonl(io.StringIO(text))
    digest = hashlib.sha256(data).hexdigest()
    if existing := _upload_with_content(workspace=workspace, digest=digest):
        return existing, False
    public_id = make_public_id("ds")
    # The object's name is ours: the client's file name is kept only as the dataset's name.
    key = keys.dataset_prefix(workspace.public_id, public_id).key("data.jsonl")
    store = store_for(keys.workspace_prefix(workspace.public_id))
    store.put_bytes(key, data)
    try:
        with transaction.atomic():  # a savepoint: callers may be inside their own transaction
            dataset = Dataset.objects.create(
                public_id=public_id,
                workspace=workspace,
                source=Dataset.Source.UPLOAD,
                name=name or file.name,
                object_key=key,
                content_sha256=digest,
                size_bytes=len(data),
                row_count=row_count,
                first_bad_line=first_bad,
            )
    except IntegrityError:
        # The same bytes arrived at the same time and the other upload's row won.
        existing = _upload_with_content(workspace=workspace, digest=digest)
        if existing is None:
            raise
        store.delete([key])
        return existing, False
    return dataset, True


def _upload_with_content(*, workspace: Workspace, digest: str) -> Dataset | None:
    return Dataset.objects.filter(
        workspace=workspace, source=Dataset.Source.UPLOAD, content_sha256=digest
    ).first()


def create_hf_dataset(
    *, workspace: Workspace, repo: str, split: str = "train", revision: str = "main", name: str = ""
) -> Dataset:
    """Recorded only: the worker fetches it (the control plane never downloads from a hub).
    The repo is a hub id and never a path, so no worker is pointed at a folder of its machine."""
    if not specs.is_hub_id(repo) or "/" not in repo:  # `json`, `csv`: loaders of local files
        raise VeriError(
            "repo must be a Hugging Face dataset id like 'openai/gsm8k' (owner/name).",
            field="repo",
            code="invalid_dataset",
        )
    for field, value, rule in (
        ("split", split, specs.HUB_SPLIT_RE),
        ("revision", revision, specs.HUB_REVISION_RE),
    ):
        if value and not rule.fullmatch(value):
            raise VeriError(
                f"{field} {value[:100]!r} is not a Hugging Face {field}.",
                field=field,
                code="invalid_dataset",
            )
    return Dataset.objects.create(
        workspace=workspace,
        source=Dataset.Source.HF,
        name=name or repo,
        hf_repo=repo,
        hf_split=split or "train",
        hf_revision=revision or "main",
    )


@transaction.atomic
def create_volume_dataset(
    *, workspace: Workspace, volume: str, path: str, name: str = ""
) -> Dataset:
    """A file in a volume; the worker reads it from the mount (`/mnt/<volume>/<path>`)."""
    path = validate_path(path)
    found = volume_selectors.get_volume(workspace=workspace, id_or_name=volume)
    if volume_selectors.get_file(volume=found, path=path) is None:
        raise VeriError(
            f"Volume {found.name!r} has no file {path!r}.", field="path", code="invalid_dataset"
        )
    return Dataset.objects.create(
        workspace=workspace,
        source=Dataset.Source.VOLUME,
        name=name or f"{found.name}/{path}",
        volume=found,
        volume_name=found.name,
        path=path,
    )


def preview_dataset(*, dataset: Dataset, rows: int = PREVIEW_ROWS) -> list:
    """The first `rows` rows of an uploaded or volume dataset, each as its JSON value (a line that
    is not JSON comes back as its text), read from the store up to `PREVIEW_MAX_BYTES`."""
    if dataset.source == Dataset.Source.HF:
        raise VeriError(
            f"Dataset {dataset.public_id} is the Hugging Face dataset {dataset.hf_repo!r}: its "
            "rows are on the hub (the worker fetches them), not in Veri, so there is nothing to "
            "preview here.",
            code="preview_unavailable",
        )
    if dataset.source == Dataset.Source.UPLOAD:
        store = store_for(keys.workspace_prefix(dataset.workspace.public_id))
        key, byte_range = dataset.object_key, None
    else:
        found = dataset.volume and volume_selectors.get_file(
            volume=dataset.volume, path=dataset.path
        )
        if not found:
            raise Conflict(
                f"Volume {dataset.volume_name!r} no longer has the file {dataset.path!r}.",
                code="preview_unavailable",
            )
        store, key = store_for(dataset.volume.store_prefix), found.object_key
        byte_range = found.byte_range
    head, chunks = b"", store.iter_bytes(key, byte_range=byte_range)
    try:
        for chunk in chunks:
            head += chunk
            if head.count(b"\n") > rows or len(head) >= PREVIEW_MAX_BYTES:
                break
    finally:
        chunks.close()
    lines = [
        line
        for line in head[:PREVIEW_MAX_BYTES].decode("utf-8", "replace").splitlines()
        if line.strip()
    ]
    return [_row(line) for line in lines[:rows]]


def _row(line: str):
    try:
        return json.loads(line)
    except (ValueError, RecursionError):
        return line


@transaction.atomic
def delete_dataset(*, dataset: Dataset) -> None:
    """Delete a dataset nothing uses, with its stored object. Refused (409, naming them) while a
    job trained or validates on it or an OpenAI file is it: those keep it as their record."""
    try:
        with transaction.atomic():
            dataset.delete()
    except ProtectedError as exc:
        users = sorted(
            {
                f"{'job' if isinstance(user, TrainingJob) else user._meta.verbose_name} "
                f"{user.public_id}"
                for user in exc.protected_objects
            }
        )
        shown = ", ".join(users[:10]) + (f" and {len(users) - 10} more" if len(users) > 10 else "")
        raise Conflict(
            f"Dataset {dataset.public_id} is used by {shown}; it cannot be deleted while they "
            "exist.",
            code="dataset_in_use",
        ) from None
    if dataset.object_key:
        schedule_store_deletion(
            key=dataset.object_key, reason=f"dataset {dataset.public_id} deleted"
        )
        enqueue_on_commit("volumes.tasks.reconcile_deleted_volumes")
