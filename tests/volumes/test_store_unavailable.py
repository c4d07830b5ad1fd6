"""The object store being away (its endpoint a port nothing listens on) never makes a request 500:
every request that has to reach it answers 503 `store_unavailable` with `Retry-After` and records
nothing, and the same request succeeds once the store is back. Signing a URL needs no store, so
starting a single upload still works."""

import io
import json

import pytest

from scripts.prod_like import free_port
from tests.conftest import fill_volume, put_to_url
from tests.training.conftest import GRPO_ROWS, job_body, upload_dataset, worker_client
from training import tasks
from training.models import Dataset, TrainingJob
from volumes.models import Upload, VolumeFile

pytestmark = pytest.mark.django_db


@pytest.fixture
def s3(settings, s3_store_url):
    settings.VERI_STORE = s3_store_url
    return settings.AWS_ENDPOINT_URL


@pytest.fixture
def store_away(settings, s3):
    """Call it to take the store away; call `.back()` to bring it back."""

    class Switch:
        def __call__(self):
            settings.AWS_ENDPOINT_URL = f"http://127.0.0.1:{free_port()}"

        def back(self):
            settings.AWS_ENDPOINT_URL = s3

    return Switch()


def assert_unavailable(response) -> dict:
    body = response.json()
    assert response.status_code == 503, body
    assert body["error"]["code"] == "store_unavailable", body
    assert "nothing was recorded" in body["error"]["message"]
    assert int(response["Retry-After"]) > 0
    return body["error"]


def test_volume_requests_that_reach_the_store_are_503_and_retrying_works(
    settings, api_client, workspace, store_away
):
    settings.VERI_MULTIPART_THRESHOLD = 5 * 1024**2
    volume = fill_volume(workspace, "corpus", {"kept.txt": b"kept"})
    base = f"/v1/volumes/{volume.public_id}"
    single = api_client.post(f"{base}/files", {"path": "a.txt", "size": 3}, format="json").json()
    assert put_to_url(api_client, single["url"], b"abc").status_code == 200
    big = {"path": "big.bin", "size": 6 * 1024**2}
    multipart = api_client.post(f"{base}/files", big, format="json").json()

    store_away()
    # Signing is local: a single upload still starts.
    started = api_client.post(f"{base}/files", {"path": "b.txt", "size": 1}, format="json")
    assert started.status_code == 201
    assert_unavailable(api_client.post(f"{base}/files", big, format="json"))  # creates a multipart
    complete = f"{base}/uploads/{single['upload_id']}/complete"
    assert_unavailable(api_client.post(complete, {}, format="json"))
    assert_unavailable(
        api_client.post(
            f"{base}/uploads:complete",
            {"uploads": [{"upload_id": single["upload_id"]}]},
            format="json",
        )
    )
    assert_unavailable(api_client.delete(f"{base}/uploads/{multipart['upload_id']}"))
    dataset = io.BytesIO(b"".join(json.dumps(r).encode() + b"\n" for r in GRPO_ROWS))
    dataset.name = "train.jsonl"
    assert_unavailable(api_client.post("/v1/datasets", {"file": dataset}, format="multipart"))
    # Nothing was decided while the store was away: the upload is still pending, not aborted.
    assert Upload.objects.get(public_id=single["upload_id"]).status == "pending"
    assert not VolumeFile.objects.filter(path="a.txt").exists()
    assert not Dataset.objects.exists()
    assert api_client.get(f"{base}/files").status_code == 200  # the database alone answers

    store_away.back()
    done = api_client.post(complete, {}, format="json")
    assert (done.status_code, done.json()["size"]) == (200, 3)


def test_worker_requests_that_reach_the_store_are_503(
    settings, api_client, billed, cloud, store_away
):
    fill_volume(billed, "corpus", {"notes.txt": b"notes"})
    dataset = upload_dataset(api_client, GRPO_ROWS)
    submitted = api_client.post(
        "/v1/training_jobs", job_body(dataset, volumes=["corpus"]), format="json"
    )
    job = TrainingJob.objects.get(public_id=submitted.json()["id"])
    tasks.provision_job(job_id=job.pk)
    worker, base = worker_client(job), f"/v1/worker/jobs/{job.public_id}"

    store_away()
    # Read credentials are minted by the store's STS; a checkpoint is checked against the store.
    assert_unavailable(worker.post(f"{base}/volume-credentials", format="json"))
    checkpoint = {"step": 1, "files": [{"path": "adapter.bin", "size": 3}]}
    assert_unavailable(worker.post(f"{base}/checkpoints", checkpoint, format="json"))
    store_away.back()
    assert worker.post(f"{base}/volume-credentials", format="json").status_code == 200
