"""Datasets as a user handles them: the same file uploaded again is the same dataset, its first
rows can be read back, and it can be deleted once nothing uses it."""

import io
import json
import threading

import pytest
from django.db import connection
from rest_framework.test import APIClient

from openai_api.models import File
from tests.conftest import assert_error, client_for, fill_volume
from tests.training.conftest import GRPO_ROWS, job_body
from training.models import Dataset
from volumes import tasks as volume_tasks
from volumes.stores import get_store, keys


def post_file(client: APIClient, body: bytes, name: str = "train.jsonl"):
    upload = io.BytesIO(body)
    upload.name = name
    return client.post("/v1/datasets", {"file": upload}, format="multipart")


def jsonl(rows: list) -> bytes:
    return "".join(json.dumps(row) + "\n" for row in rows).encode()


@pytest.fixture
def store(settings, local_store_url):
    settings.VERI_STORE = local_store_url


def test_the_same_bytes_uploaded_again_are_the_same_dataset(api_client, other_api_client, store):
    first = post_file(api_client, jsonl(GRPO_ROWS))
    assert first.status_code == 201
    again = post_file(api_client, jsonl(GRPO_ROWS), name="copy.jsonl")
    assert again.status_code == 200
    assert again.json()["id"] == first.json()["id"]
    assert again.json()["name"] == "train.jsonl"  # the dataset as first uploaded
    # Other bytes are another dataset; the same bytes in another workspace are that one's own.
    other = post_file(api_client, jsonl(GRPO_ROWS[:3]))
    assert other.status_code == 201 and other.json()["id"] != first.json()["id"]
    elsewhere = post_file(other_api_client, jsonl(GRPO_ROWS))
    assert elsewhere.status_code == 201 and elsewhere.json()["id"] != first.json()["id"]
    listed = api_client.get("/v1/datasets").json()["data"]
    assert len(listed) == 2


@pytest.mark.django_db(transaction=True)
def test_concurrent_identical_uploads_end_with_one_dataset(workspace, settings, local_store_url):
    settings.VERI_STORE = local_store_url
    body, answers, start = jsonl(GRPO_ROWS), [], threading.Barrier(4)

    def upload():
        try:
            start.wait()
            answers.append(post_file(client_for(workspace), body))
        finally:
            connection.close()

    threads = [threading.Thread(target=upload) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(a.status_code for a in answers)[-1] == 201
    assert {a.status_code for a in answers} <= {200, 201}
    assert len({a.json()["id"] for a in answers}) == 1
    dataset = Dataset.objects.get()
    # The losers' objects were removed: only the winner's file is stored.
    stored = [
        o.key for o in get_store().iter_objects(keys.workspace_prefix(workspace.public_id).value)
    ]
    assert stored == [dataset.object_key]


def test_preview_answers_the_first_rows(api_client, workspace, store):
    rows = [{"prompt": f"p{i}", "answer": str(i)} for i in range(60)]
    dataset = post_file(api_client, jsonl(rows)).json()
    preview = api_client.get(f"/v1/datasets/{dataset['id']}/preview")
    assert preview.status_code == 200
    assert preview.json() == {"id": dataset["id"], "rows": rows[:5]}
    assert (
        api_client.get(f"/v1/datasets/{dataset['id']}/preview?rows=50").json()["rows"]
        == (rows[:50])
    )
    assert_error(
        api_client.get(f"/v1/datasets/{dataset['id']}/preview?rows=51"), 400, "invalid_request"
    )
    # A volume file is read from the volume; its lines need not be JSON to be shown.
    fill_volume(workspace, "corpus", {"data/train.jsonl": b'{"a": 1}\nnot json\n\n{"b": 2}\n'})
    from_volume = api_client.post(
        "/v1/datasets",
        {"source": "volume", "volume": "corpus", "path": "data/train.jsonl"},
        format="json",
    ).json()
    assert api_client.get(f"/v1/datasets/{from_volume['id']}/preview").json()["rows"] == [
        {"a": 1},
        "not json",
        {"b": 2},
    ]
    hub = api_client.post(
        "/v1/datasets", {"source": "hf", "repo": "openai/gsm8k"}, format="json"
    ).json()
    error = assert_error(
        api_client.get(f"/v1/datasets/{hub['id']}/preview"), 400, "preview_unavailable"
    )
    assert "openai/gsm8k" in error["message"] and "hub" in error["message"]


def test_delete_is_refused_while_a_job_or_file_uses_the_dataset(
    api_client, billed, cloud, workspace, store
):
    dataset = post_file(api_client, jsonl(GRPO_ROWS)).json()
    validation = post_file(api_client, jsonl(GRPO_ROWS[:2])).json()
    job = api_client.post(
        "/v1/training_jobs",
        job_body(dataset, validation_dataset_id=validation["id"]),
        format="json",
    ).json()
    for used in (dataset, validation):
        error = assert_error(api_client.delete(f"/v1/datasets/{used['id']}"), 409, "dataset_in_use")
        assert f"job {job['id']}" in error["message"]
    assert Dataset.objects.count() == 2

    # An OpenAI file that is the dataset keeps it too, and is named.
    owned = post_file(api_client, jsonl(GRPO_ROWS[:4])).json()
    file = File.objects.create(
        workspace=workspace,
        purpose=File.Purpose.FINE_TUNE,
        filename="f.jsonl",
        bytes=1,
        dataset=Dataset.objects.get(public_id=owned["id"]),
    )
    error = assert_error(api_client.delete(f"/v1/datasets/{owned['id']}"), 409, "dataset_in_use")
    assert f"file {file.public_id}" in error["message"]


def test_delete_removes_the_row_and_its_stored_file(api_client, workspace, store):
    dataset = post_file(api_client, jsonl(GRPO_ROWS)).json()
    key = Dataset.objects.get(public_id=dataset["id"]).object_key
    assert get_store().head(key) is not None
    assert api_client.delete(f"/v1/datasets/{dataset['id']}").status_code == 204
    volume_tasks.reconcile_deleted_volumes()
    assert get_store().head(key) is None
    assert_error(api_client.get(f"/v1/datasets/{dataset['id']}"), 404, "not_found")
    # Uploaded again after the delete, the bytes make a new dataset.
    again = post_file(api_client, jsonl(GRPO_ROWS))
    assert again.status_code == 201 and again.json()["id"] != dataset["id"]


def test_two_openai_files_of_the_same_bytes_share_one_dataset(workspace, store):
    from openai_api.services import files as file_services

    def upload():
        body = io.BytesIO(jsonl(GRPO_ROWS))
        body.name, body.size = "chat.jsonl", len(body.getvalue())
        return file_services.create_file(workspace=workspace, upload=body, purpose="fine-tune")

    first, second = upload(), upload()
    assert first.dataset_id == second.dataset_id
    file_services.delete_file(file=first)
    assert file_services.file_content(file=second).startswith(b'{"prompt"')
