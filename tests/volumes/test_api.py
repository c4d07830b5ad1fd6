import base64
import hashlib
from datetime import timedelta
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest
from django.utils import timezone

from tests.conftest import assert_error, in_threads, postgres_only, put_to_url
from veri import services as veri_services
from volumes import services, tasks
from volumes.models import StoreDeletion, Upload, UsageSnapshot, Volume, VolumeFile
from volumes.stores import get_store

pytestmark = pytest.mark.django_db


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def create_volume(client, name="data", **extra) -> dict:
    response = client.post("/v1/volumes", {"name": name, **extra}, format="json")
    assert response.status_code in (200, 201), response.json()
    return response.json()


def upload(
    client, volume_id: str, path: str, data: bytes, *, announce_size=None, announce_sha=True
):
    """Start, PUT and complete one file; returns the complete response."""
    body = {"path": path, "size": len(data) if announce_size is None else announce_size}
    if announce_sha:
        body["sha256"] = sha(data)
    started = client.post(f"/v1/volumes/{volume_id}/files", body, format="json")
    assert started.status_code == 201, started.json()
    answer = started.json()
    if answer.get("skipped"):
        return started
    assert put_to_url(client, answer["url"], data).status_code == 200
    return client.post(
        f"/v1/volumes/{volume_id}/uploads/{answer['upload_id']}/complete", {}, format="json"
    )


def stored_keys(prefix: str = "") -> list[str]:
    return sorted(o.key for o in get_store().iter_objects(prefix))


def test_create_is_idempotent_and_get_works_by_id_or_name(api_client):
    first = api_client.post("/v1/volumes", {"name": "my-corpus"}, format="json")
    again = api_client.post("/v1/volumes", {"name": "my-corpus"}, format="json")
    assert (first.status_code, again.status_code) == (201, 200)
    assert first.json()["id"] == again.json()["id"]
    assert first.json()["id"].startswith("vol_")
    by_name = api_client.get("/v1/volumes/my-corpus").json()
    assert by_name == api_client.get(f"/v1/volumes/{first.json()['id']}").json()
    assert by_name["region"] == "us-east-1"
    assert (by_name["file_count"], by_name["total_bytes"], by_name["status"]) == (0, 0, "ready")


@pytest.mark.parametrize(
    "name",
    ["", "-lead", "_lead", "a" * 129, "has space", "a/b", "naïve", "nul\x00", "trailing\n"],
)
def test_bad_volume_names_are_refused(api_client, name):
    response = api_client.post("/v1/volumes", {"name": name}, format="json")
    assert_error(response, 400, "invalid_name", field="name")
    assert not Volume.objects.exists()


def test_longest_valid_name_is_accepted(api_client):
    assert create_volume(api_client, "a" * 128)["name"] == "a" * 128


def test_unknown_and_coming_soon_regions_list_the_valid_ones(api_client):
    for region in ["mars-1", "eu-central-1"]:
        error = assert_error(
            api_client.post("/v1/volumes", {"name": "x", "region": region}, format="json"),
            400,
            "invalid_region",
            field="region",
        )
        assert "us-east-1" in error["message"] and "us-west-2" in error["message"]


@pytest.mark.parametrize(
    "path",
    [
        "",
        "/abs.txt",
        "a/../b",
        "../up",
        "a//b",
        "./a",
        "a/./b",
        "dir/",
        "nul\x00x",
        "ctl\x07x",
        "tab\tx",
        "x" * 901,
    ],
)
def test_bad_paths_are_refused(api_client, settings, local_store_url, path):
    settings.VERI_STORE = local_store_url
    volume = create_volume(api_client)
    response = api_client.post(
        f"/v1/volumes/{volume['id']}/files", {"path": path, "size": 1}, format="json"
    )
    assert_error(response, 400, "invalid_path", field="path")
    batch = api_client.post(
        f"/v1/volumes/{volume['id']}/uploads:batch",
        {"files": [{"path": "ok.txt", "size": 1}, {"path": path, "size": 1}]},
        format="json",
    )
    assert_error(batch, 400, "invalid_path", field="files.1.path")
    assert not Upload.objects.exists()


def test_missing_key_malformed_key_and_revoked_key_are_401(api_client, workspace):
    api_client.credentials()
    assert_error(api_client.get("/v1/volumes"), 401, "not_authenticated")
    for header in ["Bearer nonsense", "Bearer veri_sk_", "Token abc", "Bearer veri_sk_abcd_wrong"]:
        api_client.credentials(HTTP_AUTHORIZATION=header)
        assert_error(api_client.get("/v1/volumes"), 401, "authentication_failed")
    api_key, raw = veri_services.create_api_key(workspace=workspace)
    api_client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert api_client.get("/v1/volumes").status_code == 200
    api_key.refresh_from_db()
    assert api_key.last_used_at is not None
    veri_services.revoke_api_key(api_key=api_key)
    assert_error(api_client.get("/v1/volumes"), 401, "authentication_failed")


def test_every_volume_endpoint_hides_other_workspaces(
    api_client, other_api_client, settings, local_store_url
):
    settings.VERI_STORE = local_store_url
    volume = create_volume(api_client)
    started = api_client.post(
        f"/v1/volumes/{volume['id']}/files", {"path": "a", "size": 1}, format="json"
    ).json()
    vid, uid = volume["id"], started["upload_id"]
    calls = [
        ("get", f"/v1/volumes/{vid}", None),
        ("get", "/v1/volumes/data", None),
        ("delete", f"/v1/volumes/{vid}?confirm=data", None),
        ("get", f"/v1/volumes/{vid}/files", None),
        ("post", f"/v1/volumes/{vid}/files", {"path": "b", "size": 1}),
        ("post", f"/v1/volumes/{vid}/uploads/{uid}/complete", {}),
        ("delete", f"/v1/volumes/{vid}/uploads/{uid}", None),
        ("post", f"/v1/volumes/{vid}/uploads:batch", {"files": [{"path": "c", "size": 1}]}),
        ("post", f"/v1/volumes/{vid}/uploads:complete", {"uploads": [{"upload_id": uid}]}),
        ("get", f"/v1/volumes/{vid}/usage", None),
    ]
    for method, url, body in calls:
        response = getattr(other_api_client, method)(url, body, format="json")
        assert_error(response, 404, "not_found")
    assert other_api_client.get("/v1/volumes").json()["data"] == []
    assert Volume.objects.get().file_count == 0
    assert Upload.objects.get().status == Upload.Status.PENDING


def test_upload_records_the_file_and_counters(api_client, store_kind):
    volume = create_volume(api_client)
    data = b"line\n" * 1000
    response = upload(api_client, volume["id"], "train/data.jsonl", data)
    assert response.status_code == 200, response.json()
    assert response.json()["path"] == "train/data.jsonl"
    files = api_client.get(f"/v1/volumes/{volume['id']}/files").json()["data"]
    assert [(f["path"], f["size"], f["sha256"]) for f in files] == [
        ("train/data.jsonl", len(data), sha(data))
    ]
    got = api_client.get(f"/v1/volumes/{volume['id']}").json()
    assert (got["file_count"], got["total_bytes"]) == (1, len(data))
    key = VolumeFile.objects.get().object_key
    assert get_store().get_bytes(key) == data


def test_size_mismatch_records_nothing(api_client, store_kind):
    volume = create_volume(api_client)
    response = upload(
        api_client, volume["id"], "a.bin", b"12345", announce_size=6, announce_sha=False
    )
    error = assert_error(response, 400, "upload_incomplete")
    assert "6" in error["message"] and "5" in error["message"]
    assert not VolumeFile.objects.exists()
    assert Upload.objects.get().status == Upload.Status.ABORTED
    got = api_client.get(f"/v1/volumes/{volume['id']}").json()
    assert (got["file_count"], got["total_bytes"]) == (0, 0)


def test_checksum_mismatch_keeps_the_file_already_there(api_client, settings, local_store_url):
    settings.VERI_STORE = local_store_url
    volume = create_volume(api_client)
    good = b"good bytes"
    assert upload(api_client, volume["id"], "f.txt", good).status_code == 200
    started = api_client.post(
        f"/v1/volumes/{volume['id']}/files",
        {"path": "f.txt", "size": 10, "sha256": sha(b"other byte")},
        format="json",
    ).json()
    refused = put_to_url(api_client, started["url"], b"bad  bytes")  # the store checks the sha256
    assert_error(refused, 400, "bad_digest")
    response = api_client.post(
        f"/v1/volumes/{volume['id']}/uploads/{started['upload_id']}/complete", {}, format="json"
    )
    assert "nothing was uploaded" in assert_error(response, 400, "upload_incomplete")["message"]
    file = VolumeFile.objects.get()
    assert (file.sha256, get_store().get_bytes(file.object_key)) == (sha(good), good)
    tasks.reconcile_deleted_volumes()
    assert get_store().get_bytes(file.object_key) == good
    assert Volume.objects.get().total_bytes == len(good)


def test_s3_puts_are_signed_with_the_announced_sha256(api_client, settings, s3_store_url):
    # moto ignores checksums and signatures, so what is asserted is what real S3 enforces: the
    # checksum header and the create-only condition are part of the signature (neither can be
    # dropped or changed) and the client is told to send them.
    settings.VERI_STORE = s3_store_url
    volume = create_volume(api_client)
    digest = sha(b"payload")
    answer = api_client.post(
        f"/v1/volumes/{volume['id']}/files",
        {"path": "p", "size": 7, "sha256": digest},
        format="json",
    ).json()
    expected = base64.b64encode(bytes.fromhex(digest)).decode()
    assert answer["headers"] == {"x-amz-checksum-sha256": expected, "If-None-Match": "*"}
    query = parse_qs(urlsplit(answer["url"]).query)
    signed = query["X-Amz-SignedHeaders"][0].split(";")
    assert {"x-amz-checksum-sha256", "if-none-match"} <= set(signed)
    response = httpx.put(
        answer["url"],
        content=b"payload",
        headers={**answer["headers"], "Content-Type": "application/octet-stream"},
    )
    assert response.status_code == 200


def test_reupload_replaces_the_file_and_counters_stay_exact(api_client, store_kind):
    volume = create_volume(api_client)
    upload(api_client, volume["id"], "keep.txt", b"k" * 7)
    upload(api_client, volume["id"], "same.txt", b"a" * 100)
    old_key = VolumeFile.objects.get(path="same.txt").object_key
    response = upload(api_client, volume["id"], "same.txt", b"b" * 40)
    assert response.status_code == 200
    got = api_client.get(f"/v1/volumes/{volume['id']}").json()
    assert (got["file_count"], got["total_bytes"]) == (2, 47)
    new_key = VolumeFile.objects.get(path="same.txt").object_key
    assert get_store().get_bytes(new_key) == b"b" * 40
    tasks.reconcile_deleted_volumes()
    assert get_store().head(old_key) is None
    assert get_store().head(new_key) is not None
    # The same bytes again: skipped, nothing changes.
    again = upload(api_client, volume["id"], "same.txt", b"b" * 40)
    assert (again.status_code, again.json()) == (201, {"path": "same.txt", "skipped": True})


def test_completing_twice_answers_the_same_file(api_client, settings, local_store_url):
    settings.VERI_STORE = local_store_url
    volume = create_volume(api_client)
    started = api_client.post(
        f"/v1/volumes/{volume['id']}/files", {"path": "x", "size": 3}, format="json"
    ).json()
    put_to_url(api_client, started["url"], b"abc")
    url = f"/v1/volumes/{volume['id']}/uploads/{started['upload_id']}/complete"
    first, second = (api_client.post(url, {}, format="json") for _ in range(2))
    assert first.status_code == second.status_code == 200
    assert first.json() == second.json()
    assert Volume.objects.get().file_count == 1


def test_abort_removes_the_upload(api_client, settings, local_store_url):
    settings.VERI_STORE = local_store_url
    settings.VERI_MULTIPART_THRESHOLD = 10
    volume = create_volume(api_client)
    started = api_client.post(
        f"/v1/volumes/{volume['id']}/files", {"path": "big", "size": 100}, format="json"
    ).json()
    assert started["method"] == "multipart" and len(started["parts"]) == 1
    response = api_client.delete(f"/v1/volumes/{volume['id']}/uploads/{started['upload_id']}")
    assert response.status_code == 204
    assert get_store().list_multipart("") == []
    complete = api_client.post(
        f"/v1/volumes/{volume['id']}/uploads/{started['upload_id']}/complete", {}, format="json"
    )
    assert_error(complete, 409, "upload_aborted")


def test_batch_start_skips_and_batch_complete_reports_each(api_client, store_kind):
    volume = create_volume(api_client)
    upload(api_client, volume["id"], "same.txt", b"same")
    files = [
        {"path": "same.txt", "size": 4, "sha256": sha(b"same")},
        {"path": "new-1.txt", "size": 5, "sha256": sha(b"new 1")},
        {"path": "new-2.txt", "size": 9},
    ]
    started = api_client.post(
        f"/v1/volumes/{volume['id']}/uploads:batch", {"files": files}, format="json"
    )
    assert started.status_code == 201
    answers = started.json()["data"]
    assert answers[0] == {"path": "same.txt", "skipped": True}
    put_to_url(api_client, answers[1]["url"], b"new 1")
    put_to_url(api_client, answers[2]["url"], b"short")  # 5 bytes, 9 announced
    completed = api_client.post(
        f"/v1/volumes/{volume['id']}/uploads:complete",
        {
            "uploads": [{"upload_id": a["upload_id"]} for a in answers[1:]]
            + [{"upload_id": "upl_unknown"}]
        },
        format="json",
    ).json()["data"]
    assert [c["ok"] for c in completed] == [True, False, False]
    assert completed[0]["file"]["path"] == "new-1.txt"
    assert completed[1]["error"]["code"] == "upload_incomplete"
    assert completed[2]["error"]["code"] == "not_found"
    got = api_client.get(f"/v1/volumes/{volume['id']}").json()
    assert (got["file_count"], got["total_bytes"]) == (2, 9)


def test_batches_over_500_files_are_413(api_client, settings, local_store_url):
    settings.VERI_STORE = local_store_url
    volume = create_volume(api_client)
    files = [{"path": f"f{i}", "size": 1} for i in range(501)]
    response = api_client.post(
        f"/v1/volumes/{volume['id']}/uploads:batch", {"files": files}, format="json"
    )
    assert_error(response, 413, "too_many_files", field="files")
    assert not Upload.objects.exists()


def test_delete_needs_the_name_then_reconcile_removes_exactly_that_prefix(api_client, store_kind):
    data = create_volume(api_client, "data")
    data2 = create_volume(api_client, "data2")
    for volume in (data, data2):
        upload(api_client, volume["id"], "a.txt", b"aaa")
        upload(api_client, volume["id"], "sub/b.txt", b"bb")
    refused = api_client.delete(f"/v1/volumes/{data['id']}")
    error = assert_error(refused, 400, "confirmation_required", field="confirm")
    assert (error["file_count"], error["total_bytes"]) == (2, 5)
    wrong = api_client.delete(f"/v1/volumes/{data['id']}?confirm=data2")
    assert_error(wrong, 400, "confirmation_required")
    assert api_client.delete(f"/v1/volumes/{data['id']}?confirm=data").status_code == 204
    assert_error(api_client.get(f"/v1/volumes/{data['id']}"), 404, "not_found")
    data_prefix = StoreDeletion.objects.get(key__endswith="/").key
    data2_keys = [k for k in stored_keys() if not k.startswith(data_prefix)]
    assert len(stored_keys(data_prefix)) == 2 and len(data2_keys) == 2

    tasks.reconcile_deleted_volumes()
    assert stored_keys() == data2_keys
    assert StoreDeletion.objects.get(key=data_prefix).done_at is not None
    assert tasks.reconcile_deleted_volumes() == 0  # nothing left to do the second time
    # The name is free again, with a new prefix.
    again = create_volume(api_client, "data")
    assert again["id"] != data["id"] and again["file_count"] == 0


def test_force_delete_skips_the_confirmation(api_client, settings, local_store_url):
    settings.VERI_STORE = local_store_url
    volume = create_volume(api_client)
    assert api_client.delete(f"/v1/volumes/{volume['id']}?force=true").status_code == 204
    assert not Volume.objects.exists()


def test_usage_snapshots_are_hourly_and_idempotent(api_client, settings, local_store_url):
    settings.VERI_STORE = local_store_url
    volume = create_volume(api_client)
    upload(api_client, volume["id"], "a", b"12345")
    now = timezone.now()
    # Completing the upload already wrote this hour's snapshot: the hourly run adds none.
    assert tasks.take_usage_snapshots(now=now) == 0
    assert tasks.take_usage_snapshots(now=now + timedelta(hours=1)) == 1
    usage = api_client.get(f"/v1/volumes/{volume['id']}/usage").json()["data"]
    assert [(u["file_count"], u["total_bytes"]) for u in usage] == [(1, 5), (1, 5)]
    assert UsageSnapshot.objects.count() == 2


def test_stale_uploads_are_aborted_after_a_day(api_client, store_kind, settings):
    settings.VERI_MULTIPART_THRESHOLD = 10
    volume = create_volume(api_client)
    fresh = api_client.post(
        f"/v1/volumes/{volume['id']}/files", {"path": "fresh", "size": 100}, format="json"
    ).json()
    stale = api_client.post(
        f"/v1/volumes/{volume['id']}/files", {"path": "stale", "size": 100}, format="json"
    ).json()
    Upload.objects.filter(public_id=stale["upload_id"]).update(
        created_at=timezone.now() - timedelta(days=1, minutes=1)
    )
    assert tasks.abort_stale_uploads() == 1
    assert Upload.objects.get(public_id=stale["upload_id"]).status == Upload.Status.ABORTED
    assert Upload.objects.get(public_id=fresh["upload_id"]).status == Upload.Status.PENDING
    in_store = {u.key.rsplit("/", 1)[-1] for u in get_store().list_multipart("")}
    assert in_store == {"fresh"}
    # A multipart upload nobody owns is aborted once the store says it is a day old.
    get_store().create_multipart(f"workspaces/orphan/{volume['id']}/x")
    assert tasks.abort_stale_uploads(now=timezone.now() + timedelta(days=2)) == 2
    assert get_store().list_multipart("") == []


def test_pagination_walks_every_volume_once(api_client):
    names = [f"v{i}" for i in range(7)]
    for name in names:
        create_volume(api_client, name)
    seen, cursor = [], None
    while True:
        params = {"limit": 3} | ({"cursor": cursor} if cursor else {})
        page = api_client.get("/v1/volumes", params).json()
        seen += [v["name"] for v in page["data"]]
        cursor = page["next_cursor"]
        if not cursor:
            break
    assert seen == list(reversed(names))
    assert_error(api_client.get("/v1/volumes", {"limit": 0}), 400, "invalid_request", field="limit")
    assert_error(api_client.get("/v1/volumes", {"cursor": "!!"}), 400, "invalid_cursor")


@postgres_only
@pytest.mark.django_db(transaction=True)
def test_ten_concurrent_creates_make_one_volume(workspace):
    results = in_threads(10, lambda i: services.create_volume(workspace=workspace, name="race"))
    assert len({volume.public_id for volume, _ in results}) == 1
    assert sum(created for _, created in results) == 1
    assert Volume.objects.filter(workspace=workspace, name="race").count() == 1


@postgres_only
@pytest.mark.django_db(transaction=True)
def test_concurrent_completions_keep_counters_exact(workspace, settings, local_store_url):
    settings.VERI_STORE = local_store_url
    volume, _ = services.create_volume(workspace=workspace, name="busy")
    files = [services.FileToUpload(path=f"f{i % 4}", size=i + 1) for i in range(12)]
    # Three uploads of each path, started apart (a batch takes a path once).
    started = [services.start_uploads(volume=volume, files=[file])[0] for file in files]
    uploads = {u.public_id: u for u in Upload.objects.all()}
    for answer, file in zip(started, files, strict=True):
        get_store().put_bytes(uploads[answer["upload_id"]].object_key, b"x" * file.size)

    def complete(index):
        upload_row = Upload.objects.get(public_id=started[index]["upload_id"])
        return services.complete_uploads(
            volume=Volume.objects.select_related("workspace").get(pk=volume.pk),
            completions=[services.Completion(upload_row)],
        )

    in_threads(12, complete)
    volume.refresh_from_db()
    stored = VolumeFile.objects.filter(volume=volume)
    assert volume.file_count == stored.count() == 4
    assert volume.total_bytes == sum(f.size for f in stored)


def test_a_batch_needing_more_than_10000_part_urls_is_413(api_client, settings, local_store_url):
    """Twenty 5 TiB files used to be signed part by part: 200,000 URLs, a minute and 60 MB."""
    settings.VERI_STORE = local_store_url
    volume = create_volume(api_client)
    huge = 5 * 1024**4
    files = [{"path": f"f{i}", "size": huge} for i in range(20)]
    response = api_client.post(
        f"/v1/volumes/{volume['id']}/uploads:batch", {"files": files}, format="json"
    )
    assert_error(response, 413, "batch_too_large", field="files")
    assert not Upload.objects.exists()
    alone = api_client.post(
        f"/v1/volumes/{volume['id']}/files", {"path": "f0", "size": huge}, format="json"
    )  # one file of S3's largest size still gets its (at most 10,000) parts
    assert alone.status_code == 201 and len(alone.json()["parts"]) <= 10_000


def test_a_path_twice_in_one_batch_is_400_and_the_stored_file_is_kept(
    api_client, settings, local_store_url
):
    """Both entries got one object key; completing both deleted the bytes the file pointed to."""
    settings.VERI_STORE = local_store_url
    volume = create_volume(api_client)
    assert upload(api_client, volume["id"], "m.txt", b"the original").status_code == 200
    files = [{"path": "m.txt", "size": 3}, {"path": "m.txt", "size": 3}]
    answer = api_client.post(
        f"/v1/volumes/{volume['id']}/uploads:batch", {"files": files}, format="json"
    )
    assert_error(answer, 400, "duplicate_path", "files.1.path")
    assert Upload.objects.count() == 1
    file = VolumeFile.objects.get(path="m.txt")
    assert get_store().head(file.object_key).size == len(b"the original")


def test_completing_never_deletes_the_object_a_file_holds(api_client, settings, local_store_url):
    """The second wall behind the batch rule: two uploads of one object key (as a batch with a
    path twice used to make) complete one after the other, and the file's bytes stay."""
    settings.VERI_STORE = local_store_url
    volume = create_volume(api_client)
    first = api_client.post(
        f"/v1/volumes/{volume['id']}/files", {"path": "m.txt", "size": 3}, format="json"
    ).json()
    twin = Upload.objects.get(public_id=first["upload_id"])
    twin.pk, twin.public_id = None, "upl_twin"
    twin.save()
    assert put_to_url(api_client, first["url"], b"abc").status_code == 200
    for upload_id in (first["upload_id"], "upl_twin"):
        url = f"/v1/volumes/{volume['id']}/uploads/{upload_id}/complete"
        assert api_client.post(url, {}, format="json").status_code == 200
    file = VolumeFile.objects.get(path="m.txt")
    assert not StoreDeletion.objects.filter(key=file.object_key).exists()
    tasks.reconcile_deleted_volumes()
    assert get_store().head(file.object_key).size == 3
