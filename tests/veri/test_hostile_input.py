"""Inputs that used to answer 500 (or an HTML page): each is now a 4xx in the API's error format,
and nothing is written."""

import base64
import io
import json
from datetime import timedelta

import pytest
from django.test import RequestFactory
from django.utils import timezone

from billing.services import add_credit
from tests.conftest import assert_error, fill_volume
from tests.training.conftest import GRPO_ROWS, job_body, upload_dataset, worker_client
from training import tasks
from training.models import Checkpoint, Dataset, LogChunk, MetricPoint, Sample, TrainingJob
from volumes.models import Upload, UsageSnapshot, Volume
from volumes.stores.local_view import LocalStoreView
from worker.runner import registration

pytestmark = pytest.mark.django_db

WORKER_ACTIONS = [
    "register",
    "status",
    "heartbeat",
    "logs",
    "metrics",
    "output-credentials",
    "checkpoints",
    "complete",
]


def deep(levels: int) -> str:
    return "[" * levels + "]" * levels


def add_usage(volume: Volume, *, hours: int) -> None:
    """Hourly usage snapshots of `volume` for the last `hours` hours."""
    now = timezone.now().replace(minute=0, second=0, microsecond=0)
    for ago in range(hours):
        UsageSnapshot.objects.update_or_create(  # the upload wrote this hour's already
            volume_ref=volume.public_id,
            hour=now - timedelta(hours=ago),
            defaults={
                "volume": volume,
                "workspace": volume.workspace,
                "file_count": volume.file_count,
                "total_bytes": volume.total_bytes,
            },
        )


def post_raw(client, url: str, raw: str | bytes):
    return client.generic("POST", url, raw, content_type="application/json")


@pytest.fixture
def launched(api_client, billed, cloud, settings, local_store_url):
    settings.VERI_STORE = local_store_url
    dataset = upload_dataset(api_client, GRPO_ROWS)
    response = api_client.post("/v1/training_jobs", job_body(dataset), format="json")
    job = TrainingJob.objects.get(public_id=response.json()["id"])
    tasks.provision_job(job_id=job.pk)
    job.refresh_from_db()
    worker = worker_client(job)
    worker.post(f"/v1/worker/jobs/{job.public_id}/register", registration(), format="json")
    return job, worker


def test_integers_past_64_bits_are_400_with_their_field(api_client, workspace, launched):
    job, worker = launched
    volume = fill_volume(workspace, "corpus", {"a.txt": b"a"})
    huge = 2**70
    answer = post_raw(
        api_client, f"/v1/volumes/{volume.public_id}/files", f'{{"path": "b", "size": {huge}}}'
    )
    assert_error(answer, 400, "parse_error", "size")
    base = f"/v1/worker/jobs/{job.public_id}"
    for action, body, field in [
        ("heartbeat", f'{{"step": {huge}}}', "step"),
        ("logs", f'{{"lines": [{{"seq": {huge}, "text": "x"}}]}}', "lines.0.seq"),
        ("metrics", f'{{"points": [{{"step": {huge}, "values": {{}}}}]}}', "points.0.step"),
    ]:
        assert_error(post_raw(worker, f"{base}/{action}", body), 400, "parse_error", field)
    # Past the 32-bit step columns but inside 64 bits: the serializer's bound, not a 500.
    for action, body, field in [
        ("heartbeat", {"step": 2**40}, "step"),
        ("metrics", {"points": [{"step": 2**40, "values": {"loss": 1}}]}, "points.0.step"),
        ("checkpoints", {"step": 2**40, "files": [{"path": "a", "size": 1}]}, "step"),
        ("checkpoints", {"step": 1, "files": [{"path": "a", "size": 2**62}]}, "files.0.size"),
    ]:
        assert_error(
            worker.post(f"{base}/{action}", body, format="json"), 400, "invalid_request", field
        )
    assert Upload.objects.filter(volume=volume).count() == 1
    assert not MetricPoint.objects.exists() and not LogChunk.objects.exists()
    assert not Checkpoint.objects.exists()
    job.refresh_from_db()
    assert job.last_step is None


def test_a_file_larger_than_the_store_takes_is_413(
    api_client, workspace, settings, local_store_url
):
    settings.VERI_STORE = local_store_url
    volume = fill_volume(workspace, "corpus", {"a.txt": b"a"})
    answer = api_client.post(
        f"/v1/volumes/{volume.public_id}/files",
        {"path": "huge.bin", "size": 5 * 1024**4 + 1},
        format="json",
    )
    assert_error(answer, 413, "file_too_large", "size")
    assert Upload.objects.filter(volume=volume).count() == 1


@pytest.mark.parametrize("levels", [40, 100_000])
def test_deeply_nested_bodies_are_400(api_client, launched, levels):
    job, worker = launched
    body = f'{{"name": {deep(levels)}}}'
    assert_error(post_raw(api_client, "/v1/volumes", body), 400, "parse_error")
    for action in WORKER_ACTIONS:
        url = f"/v1/worker/jobs/{job.public_id}/{action}"
        assert_error(post_raw(worker, url, body), 400, "parse_error")
    assert not Volume.objects.exists()


@pytest.mark.parametrize("action", WORKER_ACTIONS)
def test_worker_endpoints_refuse_a_list_for_an_object(launched, action):
    job, worker = launched
    answer = worker.post(f"/v1/worker/jobs/{job.public_id}/{action}", [1, 2], format="json")
    assert_error(answer, 400, "invalid_request")
    job.refresh_from_db()
    assert job.status == "configuring"


@pytest.mark.parametrize(
    "value",
    [{"a": 1}, [1, 2], 2**80, -1.5, True, "x" * 5000, None],
    ids=["object", "list", "huge", "float", "bool", "long", "null"],
)
def test_cursors_we_did_not_give_out_are_400(api_client, workspace, value):
    fill_volume(workspace, "corpus", {"a.txt": b"a", "b.txt": b"b"})
    cursor = base64.urlsafe_b64encode(json.dumps(value).encode()).decode()
    for url in ("/v1/volumes", "/v1/volumes/corpus/files", "/v1/volumes/corpus/usage"):
        assert_error(api_client.get(url, {"cursor": cursor}), 400, "invalid_cursor", "cursor")
    assert_error(api_client.get("/v1/volumes", {"cursor": "%%%"}), 400, "invalid_cursor")


def test_cursors_that_no_database_could_take_are_400(api_client, workspace):
    fill_volume(workspace, "corpus", {"a.txt": b"a"})
    for url, value in [
        ("/v1/volumes/corpus/files", "\ud800"),
        ("/v1/volumes/corpus/files", "\udfff\ud800"),
        ("/v1/volumes/corpus/usage", "9999-12-31T23:59:59-14:00"),
        ("/v1/volumes/corpus/usage", "0001-01-01T00:00:00+14:00"),
    ]:
        cursor = base64.urlsafe_b64encode(json.dumps(value).encode()).decode()
        assert_error(api_client.get(url, {"cursor": cursor}), 400, "invalid_cursor", "cursor")


@pytest.mark.parametrize(
    "repo", [".veri/store", "/tmp", "..", "../x", "a/b/c", "./data", "~/x", "a b", "json", "csv"]
)
def test_a_hugging_face_dataset_is_an_id_never_a_path(api_client, billed, repo):
    answer = api_client.post("/v1/datasets", {"source": "hf", "repo": repo}, format="json")
    assert_error(answer, 400, "invalid_dataset", "repo")
    answer = api_client.post(
        "/v1/datasets", {"source": "hf", "repo": "openai/gsm8k", "revision": "../x"}, format="json"
    )
    assert_error(answer, 400, "invalid_dataset", "revision")
    assert not Dataset.objects.exists()
    ok = api_client.post(
        "/v1/datasets", {"source": "hf", "repo": "openai/gsm8k", "split": "train[:10%]"}
    )
    assert ok.status_code == 201


def test_store_urls_and_the_schema_answer_errors_in_json(api_client, workspace, settings, tmp_path):
    settings.VERI_STORE = f"file://{tmp_path / 'store'}"
    volume = fill_volume(workspace, "corpus", {"a.txt": b"a"})
    started = api_client.post(
        f"/v1/volumes/{volume.public_id}/files", {"path": "b.txt", "size": 1}, format="json"
    ).json()
    url = started["url"].removeprefix("http://testserver")
    for method in ("delete", "post"):
        assert_error(getattr(api_client, method)(url), 405, "method_not_allowed")
    request = RequestFactory().put(url, b"x")  # as a chunked body arrives: no Content-Length
    del request.META["CONTENT_LENGTH"]
    answer = LocalStoreView.as_view()(request, token=url.rsplit("/", 1)[-1])
    assert answer.status_code == 411 and json.loads(answer.content)["error"]["code"] == (
        "length_required"
    )
    assert_error(api_client.delete("/v1/schema"), 405, "method_not_allowed")
    assert_error(api_client.get("/v1/schema", {"format": "xml"}), 404, "not_found")


def test_usage_pages_by_hour(api_client, workspace):
    """Usage lists are ordered by hour: their cursor is a time (it used to fail to encode)."""
    add_usage(fill_volume(workspace, "corpus", {"a.txt": b"a"}), hours=3)
    seen, cursor = [], None
    while True:
        params = {"limit": 1} | ({"cursor": cursor} if cursor else {})
        page = api_client.get("/v1/volumes/corpus/usage", params).json()
        seen += [row["hour"] for row in page["data"]]
        if not (cursor := page["next_cursor"]):
            break
    assert len(seen) == 3 and seen == sorted(seen, reverse=True)


def test_a_body_over_the_limit_is_413_json(api_client, settings):
    settings.VERI_MAX_JSON_BYTES = 1024**2
    body = json.dumps({"name": "x", "region": "y" * (2 * 1024**2)})
    answer = post_raw(api_client, "/v1/volumes", body)
    assert answer["Content-Type"] == "application/json"
    assert_error(answer, 413, "request_too_large")
    assert not Volume.objects.exists()


def test_a_multipart_dataset_over_the_limit_is_413_json(api_client, billed, settings):
    settings.VERI_DATASET_MAX_BYTES = 1024
    settings.VERI_MAX_JSON_BYTES = 1024
    upload = io.BytesIO(b'{"prompt": "x"}\n' * 1000)
    upload.name = "train.jsonl"
    answer = api_client.post("/v1/datasets", {"file": upload}, format="multipart")
    assert_error(answer, 413, "request_too_large")
    assert not Dataset.objects.exists()


def test_a_deeply_nested_dataset_line_is_invalid_dataset(
    api_client, billed, settings, local_store_url
):
    settings.VERI_STORE = local_store_url
    for levels in (100_000, 50):
        upload = io.BytesIO(
            b'{"prompt": "fine"}\n{"prompt": "x", "extra": ' + deep(levels).encode() + b"}\n"
        )
        upload.name = "train.jsonl"
        answer = api_client.post("/v1/datasets", {"file": upload}, format="multipart")
        if levels > 1000:
            assert_error(answer, 400, "invalid_dataset", "file")
        else:  # deep but readable: the row still fits grpo
            assert answer.status_code == 201, answer.json()
    assert Dataset.objects.count() == 1


def test_nul_in_the_url_and_lone_surrogates_in_the_body_are_400(api_client, workspace):
    fill_volume(workspace, "corpus", {"a.txt": b"a"})
    assert_error(api_client.get("/v1/volumes/corpus/files?prefix=%00"), 400, "invalid_request")
    assert_error(api_client.get("/v1/volumes/vol%00x"), 400, "invalid_request")
    answer = post_raw(api_client, "/v1/volumes", '{"name": "a\\ud800b"}')
    assert_error(answer, 400, "parse_error", "name")
    answer = post_raw(api_client, "/v1/volumes", '{"name": "ok", "\\u0000": 1}')
    assert_error(answer, 400, "parse_error")
    assert Volume.objects.count() == 1


def test_a_log_line_with_nul_is_kept_not_refused(launched):
    job, worker = launched
    answer = worker.post(
        f"/v1/worker/jobs/{job.public_id}/logs",
        {"lines": [{"seq": 0, "text": "bin\x00ary"}, {"seq": 1, "text": "y" * 100_000}]},
        format="json",
    )
    assert answer.status_code == 200, answer.json()
    texts = list(LogChunk.objects.order_by("seq").values_list("text", flat=True))
    assert texts[0] == "bin\ufffdary" and len(texts[1]) == 16_384


def test_metric_names_are_checked(launched):
    job, worker = launched
    answer = worker.post(
        f"/v1/worker/jobs/{job.public_id}/metrics",
        {"points": [{"step": 1, "values": {"bad\x00name": 1.0}}]},
        format="json",
    )
    assert_error(answer, 400, "parse_error")
    answer = worker.post(
        f"/v1/worker/jobs/{job.public_id}/metrics",
        {"points": [{"step": 1, "values": {"x" * 200: 1.0}}]},
        format="json",
    )
    assert_error(answer, 400, "invalid_request", "points.0.values")
    assert not MetricPoint.objects.exists()


def test_empty_batches_are_400(api_client, workspace):
    volume = fill_volume(workspace, "corpus", {"a.txt": b"a"})
    for action, body in (("uploads:batch", {"files": []}), ("uploads:complete", {"uploads": []})):
        answer = api_client.post(f"/v1/volumes/{volume.public_id}/{action}", body, format="json")
        assert_error(answer, 400, "invalid_request")
    assert Upload.objects.filter(volume=volume).count() == 1


def test_cursors_are_sealed_and_tell_nothing_of_other_workspaces(api_client, workspace):
    """A cursor holding a row's id would let a workspace count every other's rows over time."""
    for name in ("a", "b", "c"):
        fill_volume(workspace, name, {"x.txt": b"x"})
    cursor = api_client.get("/v1/volumes", {"limit": 1}).json()["next_cursor"]
    again = api_client.get("/v1/volumes", {"limit": 1}).json()["next_cursor"]
    assert cursor != again  # the same position, sealed afresh: no id shows through
    raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
    with pytest.raises(ValueError):
        json.loads(raw)
    assert api_client.get("/v1/volumes", {"cursor": cursor, "limit": 1}).status_code == 200
    forged = cursor[:-2] + ("A" if cursor[-2] != "A" else "B") + cursor[-1]
    assert_error(api_client.get("/v1/volumes", {"cursor": forged}), 400, "invalid_cursor")


def test_a_cursor_given_out_by_one_list_is_refused_by_every_other(api_client, workspace, launched):
    """Each list seals which list its cursor is for: one list's position sent to another (an id
    where a path or an hour belongs) used to reach the database and answer 500."""
    job, worker = launched
    volume = fill_volume(workspace, "corpus", {"a.txt": b"a", "b.txt": b"b"})
    fill_volume(workspace, "other", {"c.txt": b"c"})
    add_usage(volume, hours=2)
    api_client.post(
        "/v1/training_jobs", job_body(upload_dataset(api_client, GRPO_ROWS[:4])), "json"
    )
    for step in (1, 2):
        MetricPoint.objects.create(job=job, step=step, at=timezone.now(), values={"loss": 1.0})
        Checkpoint.objects.create(workspace=workspace, job=job, step=step)
        Sample.objects.create(job=job, step=step, index=0, prompt="p", completion="c", reward=0.0)
    add_credit(workspace=workspace, amount_micros=1, reason="test", key="cursor-test")
    lists = [
        "/v1/volumes",
        f"/v1/volumes/{volume.public_id}/files",
        f"/v1/volumes/{volume.public_id}/usage",
        "/v1/datasets",
        "/v1/training_jobs",
        f"/v1/training_jobs/{job.public_id}/events",
        f"/v1/training_jobs/{job.public_id}/metrics",
        f"/v1/training_jobs/{job.public_id}/checkpoints",
        f"/v1/training_jobs/{job.public_id}/samples",
        "/v1/billing/ledger",
    ]
    cursors = {url: api_client.get(url, {"limit": 1}).json()["next_cursor"] for url in lists}
    assert all(cursors.values()), cursors
    for url in lists:
        for given_by, cursor in cursors.items():
            answer = api_client.get(url, {"cursor": cursor, "limit": 1})
            if given_by == url:
                assert answer.status_code == 200, (url, answer.content)
            else:
                assert_error(answer, 400, "invalid_cursor", "cursor")


def test_a_cursor_is_refused_by_the_same_list_of_another_volume_or_workspace(
    api_client, other_api_client, workspace
):
    """A position in one volume's files (a path) or one workspace's volumes is no position in
    another's: sent there it used to page silently from it."""
    first = fill_volume(workspace, "first", {"a.txt": b"a", "b.txt": b"b"})
    second = fill_volume(workspace, "second", {"a.txt": b"a", "b.txt": b"b"})
    url = f"/v1/volumes/{first.public_id}/files"
    cursor = api_client.get(url, {"limit": 1}).json()["next_cursor"]
    assert api_client.get(url, {"cursor": cursor}).status_code == 200
    elsewhere = api_client.get(f"/v1/volumes/{second.public_id}/files", {"cursor": cursor})
    assert_error(elsewhere, 400, "invalid_cursor", "cursor")
    volumes_cursor = api_client.get("/v1/volumes", {"limit": 1}).json()["next_cursor"]
    assert_error(
        other_api_client.get("/v1/volumes", {"cursor": volumes_cursor}), 400, "invalid_cursor"
    )


@pytest.mark.parametrize("limit", [" 5", "+1", "1_0", "\uff15", "-1", "0", "201", "9" * 30])
def test_a_limit_is_plain_digits_in_range(api_client, workspace, limit):
    assert_error(api_client.get("/v1/volumes", {"limit": limit}), 400, "invalid_request", "limit")


def test_a_log_position_past_64_bits_is_400(api_client, launched):
    job, _ = launched
    url = f"/v1/training_jobs/{job.public_id}/logs"
    assert_error(api_client.get(url, {"after": 10**30}), 400, "invalid_request", "after")
    assert api_client.get(url, {"after": -1, "limit": 10**6}).status_code == 200
