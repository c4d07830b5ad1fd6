"""OpenAI files: a `fine-tune` file is a Veri dataset (checked once, here, as Veri checks every
uploaded dataset); `evals` and `user_data` files are kept as bytes and never trained on."""

from django.conf import settings
from django.db import transaction

from openai_api.models import File
from training.services import datasets
from veri.errors import TooLarge, VeriError
from veri.models import Workspace
from volumes.stores import keys, store_for

# OpenAI's method names for Veri's.
METHOD_NAMES = {"sft_text": "supervised", "dpo": "dpo", "grpo": "reinforcement"}
UPLOAD_PURPOSES = (File.Purpose.FINE_TUNE, File.Purpose.EVALS, File.Purpose.USER_DATA)


def _check_trainable(dataset) -> None:
    """A fine-tune file must fit at least one method; which one is checked again at job create."""
    bad = dataset.first_bad_line
    if len(bad) < len(METHOD_NAMES):
        return
    reasons = "; ".join(
        f"{METHOD_NAMES[method]}: line {found['line']} {found['problem']}"
        for method, found in sorted(bad.items(), key=lambda item: item[1]["line"])
    )
    raise VeriError(
        f"No fine-tuning method can train this file ({reasons}).",
        field="file",
        code="invalid_file_format",
    )


@transaction.atomic
def create_file(*, workspace: Workspace, upload, purpose: str) -> File:
    if purpose not in UPLOAD_PURPOSES:
        raise VeriError(
            f"purpose must be one of {', '.join(UPLOAD_PURPOSES)}; got {str(purpose)[:40]!r}.",
            field="purpose",
            code="invalid_purpose",
        )
    if upload is None:
        raise VeriError("Send the file as multipart field `file`.", field="file")
    name = (upload.name or "file")[:255]
    if purpose == File.Purpose.FINE_TUNE:
        # Two files of the same bytes are one dataset: deleting a file never touches its dataset.
        dataset, _ = datasets.create_uploaded_dataset(workspace=workspace, file=upload, name=name)
        _check_trainable(dataset)
        return File.objects.create(
            workspace=workspace,
            purpose=purpose,
            filename=name,
            bytes=dataset.size_bytes,
            dataset=dataset,
        )
    if upload.size > settings.VERI_DATASET_MAX_BYTES:
        raise TooLarge(
            f"The file is {upload.size} bytes; files are limited to "
            f"{settings.VERI_DATASET_MAX_BYTES} bytes here.",
            field="file",
            code="file_too_large",
        )
    file = File(workspace=workspace, purpose=purpose, filename=name, bytes=upload.size)
    file.object_key = keys.file_prefix(workspace.public_id, file.public_id).key("content")
    store_for(keys.workspace_prefix(workspace.public_id)).put_bytes(file.object_key, upload.read())
    file.save()
    return file


def write_result_file(*, workspace: Workspace, filename: str, content: bytes) -> File:
    """A file Veri writes for the customer (a job's metrics CSV)."""
    file = File(
        workspace=workspace,
        purpose=File.Purpose.FINE_TUNE_RESULTS,
        filename=filename,
        bytes=len(content),
    )
    file.object_key = keys.file_prefix(workspace.public_id, file.public_id).key("content")
    store_for(keys.workspace_prefix(workspace.public_id)).put_bytes(file.object_key, content)
    file.save()
    return file


def file_content(*, file: File) -> bytes:
    key = file.dataset.object_key if file.dataset_id else file.object_key
    return store_for(keys.workspace_prefix(file.workspace.public_id)).get_bytes(key)


def delete_file(*, file: File) -> None:
    """The file is gone from the files list; a dataset it is stays for the jobs that trained on
    it (their record), bytes kept for no job go now."""
    if file.object_key:
        store_for(keys.workspace_prefix(file.workspace.public_id)).delete([file.object_key])
    file.delete()
