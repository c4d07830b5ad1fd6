"""One spelling per path: a name typed on a Mac arrives decomposed (`cafe\u0301.txt`, NFD), the same
name typed elsewhere composed (`caf\u00e9.txt`, NFC). They look identical, so they are one file
everywhere a path enters: uploads (single and batch), the listing's prefix, volume datasets, a
volume base model, and the worker's checkpoint paths. Paths recorded before are migrated."""

import hashlib
import unicodedata
from datetime import timedelta

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.utils import timezone

from tests.conftest import assert_error, fill_volume, put_to_url
from tests.training.conftest import GRPO_ROWS, job_body, upload_dataset
from tests.training.test_hostile_paths import job_on_store  # noqa: F401 - the launched job
from training.models import Checkpoint, Dataset
from volumes.models import StoreDeletion, Upload, Volume, VolumeFile
from volumes.stores import get_store

pytestmark = pytest.mark.django_db

NFC = unicodedata.normalize("NFC", "data/caf\u00e9 \u00e0 l\u2019\u00e9t\u00e9.txt")
NFD = unicodedata.normalize("NFD", NFC)


def test_the_two_spellings_differ_as_sent():
    assert NFC != NFD and NFC.encode() != NFD.encode()


def start(client, volume_id: str, path: str, data: bytes) -> dict:
    body = {"path": path, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    started = client.post(f"/v1/volumes/{volume_id}/files", body, format="json")
    assert started.status_code == 201, started.json()
    return started.json()


def upload(client, volume_id: str, path: str, data: bytes) -> dict:
    answer = start(client, volume_id, path, data)
    assert put_to_url(client, answer["url"], data).status_code == 200
    done = client.post(
        f"/v1/volumes/{volume_id}/uploads/{answer['upload_id']}/complete", {}, format="json"
    )
    assert done.status_code == 200, done.json()
    return done.json()


def test_a_decomposed_name_replaces_the_composed_file_and_lists_composed(
    store_kind, api_client, workspace
):
    volume = fill_volume(workspace, "corpus", {"other.txt": b"x"})
    first = upload(api_client, volume.public_id, NFC, b"first")
    second = upload(api_client, volume.public_id, NFD, b"second!")
    assert first["path"] == second["path"] == NFC
    volume.refresh_from_db()
    assert (volume.file_count, volume.total_bytes) == (2, 1 + len(b"second!"))
    [file] = VolumeFile.objects.filter(volume=volume, path__startswith="data/")
    assert (file.path, get_store().get_bytes(file.object_key)) == (NFC, b"second!")
    # The listing's prefix is one spelling too, whichever is typed.
    for prefix in (NFD, unicodedata.normalize("NFD", "data/caf\u00e9")):
        listed = api_client.get(f"/v1/volumes/{volume.public_id}/files", {"prefix": prefix})
        assert [f["path"] for f in listed.json()["data"]] == [NFC], prefix
    # Re-sending the same bytes under the other spelling is skipped: it is the same file.
    again = start(api_client, volume.public_id, NFD, b"second!")
    assert again == {"path": NFC, "skipped": True}


def test_both_spellings_in_one_batch_are_a_duplicate_path(
    api_client, workspace, settings, local_store_url
):
    settings.VERI_STORE = local_store_url
    volume = fill_volume(workspace, "corpus", {"keep.txt": b"kept"})
    response = api_client.post(
        f"/v1/volumes/{volume.public_id}/uploads:batch",
        {"files": [{"path": NFC, "size": 1}, {"path": NFD, "size": 2}]},
        format="json",
    )
    error = assert_error(response, 400, "duplicate_path", field="files.1.path")
    assert "spelt two ways" in error["message"]
    assert Upload.objects.filter(volume=volume).count() == 1  # fill_volume's own


def test_a_volume_dataset_and_a_volume_base_model_find_the_file_by_either_spelling(
    store_kind, api_client, billed, cloud
):
    fill_volume(billed, "corpus", {NFC: b'{"prompt": "p", "answer": "a"}\n'})
    fill_volume(billed, "models", {"mod\u00e8le/config.json": b"{}"})
    created = api_client.post(
        "/v1/datasets", {"source": "volume", "volume": "corpus", "path": NFD}, format="json"
    )
    assert created.status_code == 201, created.json()
    assert Dataset.objects.get(public_id=created.json()["id"]).path == NFC
    dataset = upload_dataset(api_client, GRPO_ROWS)
    decomposed = unicodedata.normalize("NFD", "volume://models/mod\u00e8le")
    submitted = api_client.post(
        "/v1/training_jobs", job_body(dataset, base_model=decomposed), format="json"
    )
    assert submitted.status_code == 201, submitted.json()
    assert submitted.json()["base_model"] == "volume://models/mod\u00e8le"


def test_worker_checkpoint_paths_take_the_composed_spelling(job_on_store, api_client):  # noqa: F811
    job, worker = job_on_store
    base = f"/v1/worker/jobs/{job.public_id}"
    decomposed = unicodedata.normalize("NFD", "checkpoints/step-00000003/r\u00e9sum\u00e9.bin")
    answer = worker.post(
        f"{base}/output-credentials", {"paths": [decomposed]}, format="json"
    ).json()
    [target] = answer["files"]
    assert target["path"] == unicodedata.normalize("NFC", decomposed)
    assert put_to_url(worker, target["url"], b"abc").status_code == 200
    registered = worker.post(
        f"{base}/checkpoints",
        {
            "step": 3,
            "files": [{"path": unicodedata.normalize("NFD", "r\u00e9sum\u00e9.bin"), "size": 3}],
        },
        format="json",
    )
    assert registered.status_code == 201, registered.json()
    [checkpoint] = Checkpoint.objects.filter(job=job)
    assert [f["path"] for f in checkpoint.files] == ["r\u00e9sum\u00e9.bin"]
    listed = api_client.get(f"/v1/training_jobs/{job.public_id}/checkpoints").json()["data"]
    assert [f["path"] for f in listed[0]["files"]] == ["r\u00e9sum\u00e9.bin"]


@pytest.mark.django_db(transaction=True)
def test_the_migration_gives_recorded_paths_their_one_spelling(workspace):
    executor = MigrationExecutor(connection)
    executor.migrate([("volumes", "0004_pinned_files")])
    old = executor.loader.project_state([("volumes", "0004_pinned_files")]).apps
    OldVolume, OldFile = old.get_model("volumes", "Volume"), old.get_model("volumes", "VolumeFile")
    OldUpload = old.get_model("volumes", "Upload")
    volume = OldVolume.objects.create(
        workspace_id=workspace.pk, name="v", region="us-east-1", file_count=4, total_bytes=21
    )
    now = timezone.now()

    def recorded(path: str, size: int, age: int):
        return OldFile.objects.create(
            volume=volume,
            path=path,
            size=size,
            object_key=f"k/{size}",
            uploaded_at=now - timedelta(hours=age),
        )

    recorded(NFC, 3, age=2)  # older: leaves the volume
    recorded(NFD, 5, age=1)  # newer: keeps the name
    recorded(unicodedata.normalize("NFD", "na\u00efve.txt"), 6, age=1)  # alone: renamed
    recorded("plain.txt", 7, age=1)
    OldUpload.objects.create(
        volume=volume, path=NFD, size=1, method="single", object_key="k/u", status="pending"
    )
    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes())

    volume = Volume.objects.get(pk=volume.pk)
    files = dict(VolumeFile.objects.filter(volume=volume).values_list("path", "size"))
    assert files == {NFC: 5, "na\u00efve.txt": 6, "plain.txt": 7}
    assert (volume.file_count, volume.total_bytes) == (3, 18)
    assert list(StoreDeletion.objects.values_list("key", flat=True)) == ["k/3"]
    assert Upload.objects.get(volume=volume).path == NFC
