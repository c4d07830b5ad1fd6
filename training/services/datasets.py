import io

from django.conf import settings
from django.db import transaction

from training import specs
from training.models import Dataset
from training.specs import scan_jsonl
from veri.errors import TooLarge, VeriError
from veri.models import Workspace, make_public_id
from volumes import selectors as volume_selectors
from volumes.services import validate_path
from volumes.stores import keys, store_for


def create_uploaded_dataset(*, workspace: Workspace, file, name: str = "") -> Dataset:
    """A small `.jsonl` dataset kept in the object store; its rows are checked once, here."""
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
    public_id = make_public_id("ds")
    # The object's name is ours: the client's file name is kept only as the dataset's name.
    key = keys.dataset_prefix(workspace.public_id, public_id).key("data.jsonl")
    store_for(keys.workspace_prefix(workspace.public_id)).put_bytes(key, data)
    return Dataset.objects.create(
        public_id=public_id,
        workspace=workspace,
        source=Dataset.Source.UPLOAD,
        name=name or file.name,
        object_key=key,
        size_bytes=len(data),
        row_count=row_count,
        first_bad_line=first_bad,
    )


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
