"""`Idempotency-Key` is claimed before the work: concurrent twins never do it twice."""

import io
import json
from datetime import timedelta

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from tests.conftest import assert_error, in_threads, postgres_only
from tests.training.conftest import GRPO_ROWS, job_body, upload_dataset
from training.models import Dataset, TrainingJob
from veri import idempotency, tasks
from veri import services as veri_services
from veri.models import IdempotencyRecord
from volumes.models import Upload, Volume

CONCURRENT = 10


def keyed_client(raw_key: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw_key}", HTTP_IDEMPOTENCY_KEY="one-key")
    return client


def jsonl_file() -> io.BytesIO:
    upload = io.BytesIO("".join(json.dumps(r) + "\n" for r in GRPO_ROWS).encode())
    upload.name = "train.jsonl"
    return upload


@postgres_only
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("endpoint", ["training_jobs", "volumes", "datasets", "uploads"])
def test_concurrent_twins_with_one_key_do_the_work_once(
    endpoint, api_client, billed, cloud, settings, local_store_url
):
    settings.VERI_STORE = local_store_url
    # Not jsonl_file()'s bytes: those would be this dataset again rather than a new one.
    dataset = upload_dataset(api_client, GRPO_ROWS[:4])
    Volume.objects.create(workspace=billed, name="corpus", region="us-east-1")
    _, raw_key = veri_services.create_api_key(workspace=billed, name="race")
    before = {
        "training_jobs": TrainingJob.objects.count,
        "volumes": Volume.objects.count,
        "datasets": Dataset.objects.count,
        "uploads": Upload.objects.count,
    }[endpoint]
    start = before()

    def post(_index):
        client = keyed_client(raw_key)
        if endpoint == "training_jobs":
            response = client.post("/v1/training_jobs", job_body(dataset), format="json")
        elif endpoint == "volumes":
            response = client.post("/v1/volumes", {"name": "fresh"}, format="json")
        elif endpoint == "datasets":
            response = client.post("/v1/datasets", {"file": jsonl_file()}, format="multipart")
        else:
            response = client.post(
                "/v1/volumes/corpus/files", {"path": "a.txt", "size": 3}, format="json"
            )
        return response.status_code, response.json()

    answers = in_threads(CONCURRENT, post)
    assert before() == start + 1
    first = answers[0]
    assert first[0] == 201, first
    assert all(answer == first for answer in answers), answers


@pytest.mark.django_db
def test_a_key_still_in_progress_is_409_after_the_wait(api_client, workspace, settings):
    settings.VERI_IDEMPOTENCY_WAIT_SECONDS = 0.2
    IdempotencyRecord.objects.create(
        workspace=workspace,
        key="busy",
        request_fingerprint=idempotency.fingerprint("/v1/volumes", {"name": "x"}),
    )
    answer = api_client.post(
        "/v1/volumes", {"name": "x"}, format="json", HTTP_IDEMPOTENCY_KEY="busy"
    )
    assert_error(answer, 409, "idempotency_in_progress")
    assert not Volume.objects.exists()


@pytest.mark.django_db
def test_an_abandoned_claim_is_taken_over(api_client, workspace, settings):
    record = IdempotencyRecord.objects.create(
        workspace=workspace,
        key="crashed",
        request_fingerprint=idempotency.fingerprint("/v1/volumes", {"name": "x"}),
    )
    IdempotencyRecord.objects.filter(pk=record.pk).update(
        created_at=timezone.now() - timedelta(seconds=settings.VERI_IDEMPOTENCY_STALE_SECONDS + 1)
    )
    answer = api_client.post(
        "/v1/volumes", {"name": "x"}, format="json", HTTP_IDEMPOTENCY_KEY="crashed"
    )
    assert answer.status_code == 201
    assert IdempotencyRecord.objects.get(key="crashed").status_code == 201


@pytest.mark.django_db
@pytest.mark.parametrize("key", ["k" * 256, "tab\there", "é"])
def test_a_key_past_its_column_or_not_ascii_is_400(api_client, key):
    answer = api_client.post("/v1/volumes", {"name": "x"}, format="json", HTTP_IDEMPOTENCY_KEY=key)
    assert_error(answer, 400, "invalid_idempotency_key", "Idempotency-Key")
    assert not Volume.objects.exists() and not IdempotencyRecord.objects.exists()


@pytest.mark.django_db
def test_an_error_answer_is_replayed_too(api_client):
    """The first answer stands, even an error: a retry of a refused request is refused alike."""
    headers = {"HTTP_IDEMPOTENCY_KEY": "bad-name"}
    first = api_client.post("/v1/volumes", {"name": "-bad"}, format="json", **headers)
    again = api_client.post("/v1/volumes", {"name": "-bad"}, format="json", **headers)
    assert first.status_code == again.status_code == 400
    assert first.json() == again.json()


@pytest.mark.django_db
def test_another_file_under_the_same_name_is_another_request(
    api_client, billed, settings, tmp_path
):
    settings.VERI_STORE = f"file://{tmp_path / 'store'}"
    headers = {"HTTP_IDEMPOTENCY_KEY": "upload-1"}
    first = api_client.post("/v1/datasets", {"file": jsonl_file()}, format="multipart", **headers)
    other = io.BytesIO(b'{"prompt": "something else"}\n')
    other.name = "train.jsonl"
    again = api_client.post("/v1/datasets", {"file": other}, format="multipart", **headers)
    assert first.status_code == 201
    assert_error(again, 409, "idempotency_key_reused")
    same = api_client.post("/v1/datasets", {"file": jsonl_file()}, format="multipart", **headers)
    assert same.json() == first.json()
    assert Dataset.objects.count() == 1


def test_a_request_dying_between_its_work_and_its_answer_leaves_no_work(
    api_client, billed, cloud, monkeypatch
):
    """The work and the key's answer commit together. A request that died after the work but
    before its answer was recorded used to leave the job made and the key free: the retry (same
    key) made a second job."""
    body = job_body(upload_dataset(api_client, GRPO_ROWS))
    client = keyed_client(api_client.raw_key)
    client.raise_request_exception = False
    record = idempotency.record_answer

    def dies(**kwargs):
        raise ConnectionAbortedError("the process died here")

    monkeypatch.setattr(idempotency, "record_answer", dies)
    assert client.post("/v1/training_jobs", body, format="json").status_code == 500
    assert not TrainingJob.objects.exists() and not IdempotencyRecord.objects.exists()
    monkeypatch.setattr(idempotency, "record_answer", record)
    first = client.post("/v1/training_jobs", body, format="json")
    again = client.post("/v1/training_jobs", body, format="json")
    assert first.status_code == again.status_code == 201
    assert first.json()["id"] == again.json()["id"]
    assert TrainingJob.objects.count() == 1


def test_a_key_reused_with_a_body_that_is_not_an_object_is_409(api_client):
    """Any body counts in the fingerprint: a list (refused) and then an empty object under one key
    used to be taken for the same request (both counted as no fields), and the object got the
    list's answer replayed."""
    client = keyed_client(api_client.raw_key)
    first = client.post("/v1/volumes", [{"name": "a"}], format="json")
    assert first.status_code == 400
    assert_error(client.post("/v1/volumes", {}, format="json"), 409, "idempotency_key_reused")


def test_keys_are_forgotten_after_a_day(api_client, workspace):
    """The table would otherwise grow with every keyed POST: the hourly task drops keys older
    than VERI_IDEMPOTENCY_KEEP_SECONDS, and a retry within the day still gets its answer."""
    client = keyed_client(api_client.raw_key)
    first = client.post("/v1/volumes", {"name": "kept"}, format="json")
    assert first.status_code == 201
    IdempotencyRecord.objects.create(
        workspace=workspace, key="old", request_fingerprint="x", status_code=201
    )
    IdempotencyRecord.objects.filter(key="old").update(
        created_at=timezone.now() - timedelta(days=1, minutes=1)
    )
    assert tasks.forget_old_idempotency_keys() == 1
    assert list(IdempotencyRecord.objects.values_list("key", flat=True)) == ["one-key"]
    again = client.post("/v1/volumes", {"name": "kept"}, format="json")
    assert again.status_code == 201 and again.json() == first.json()
