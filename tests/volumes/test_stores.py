"""One suite, both stores: what the upload and reconcile code relies on, through real I/O."""

import base64
import hashlib
import json
import time
from datetime import UTC, datetime
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest
from django.core import signing
from rest_framework.test import APIClient

from tests.conftest import put_to_url
from volumes.stores import LocalStore, S3Store, StoreError, get_store


def get_url(client: APIClient, url: str, headers: dict | None = None):
    """(status, body) of a signed GET: the local store's through Django, S3's from S3."""
    if url.startswith("http://testserver/"):
        response = client.get(url.removeprefix("http://testserver"), headers=headers or {})
        body = b"".join(response.streaming_content) if response.streaming else response.content
        return response.status_code, body
    response = httpx.get(url, headers=headers or {})
    return response.status_code, response.content


@pytest.fixture
def store(store_kind, db):
    return get_store()


def test_presigned_put_then_head_get_and_sha256(store):
    client = APIClient()
    data = b"hello volumes\n" * 100
    url, headers = store.presign_put("a/b/file.txt", expires=60)
    assert headers == {}
    response = put_to_url(client, url, data)
    assert response.status_code == 200
    assert store.head("a/b/file.txt").size == len(data)
    assert store.head("a/b/missing.txt") is None
    status, body = get_url(client, store.presign_get("a/b/file.txt", expires=60))
    assert (status, body) == (200, data)


def test_multipart_parts_are_joined_in_order(store, settings):
    client = APIClient()
    parts_data = [b"a" * (5 * 1024**2), b"b" * (5 * 1024**2), b"tail"]
    upload_id = store.create_multipart("big/file.bin")
    assert [u.upload_id for u in store.list_multipart("big/")] == [upload_id]
    etags = []
    # Out of order on purpose: the store orders by part number.
    for number in (3, 1, 2):
        url = store.presign_part("big/file.bin", upload_id=upload_id, number=number, expires=60)
        response = put_to_url(client, url, parts_data[number - 1])
        assert response.status_code == 200
        etags.append((number, response.headers["ETag"].strip('"')))
    store.complete_multipart("big/file.bin", upload_id=upload_id, parts=etags)
    assert store.get_bytes("big/file.bin") == b"".join(parts_data)
    assert store.list_multipart("big/") == []


def test_abort_multipart_forgets_the_upload(store):
    upload_id = store.create_multipart("x/y.bin")
    store.abort_multipart("x/y.bin", upload_id=upload_id)
    assert store.list_multipart("x/") == []
    with pytest.raises(StoreError):
        store.complete_multipart("x/y.bin", upload_id=upload_id, parts=[(1, "etag")])


def test_delete_prefix_takes_exactly_that_prefix(store):
    for key in ["v/data/1.txt", "v/data/sub/2.txt", "v/data2/1.txt", "v/dat"]:
        store.put_bytes(key, b"x")
    store.create_multipart("v/data/pending.bin")
    assert store.delete_prefix("v/data/") == 2
    assert sorted(o.key for o in store.iter_objects("v/")) == ["v/dat", "v/data2/1.txt"]
    assert store.list_multipart("v/data/") == []
    with pytest.raises(ValueError):
        store.delete_prefix("v/data2")  # without the slash it would also take data2x


def test_delete_prefix_works_in_batches_past_1000(store):
    for i in range(1005):
        store.put_bytes(f"many/{i:04d}", b"")
    assert store.delete_prefix("many/") == 1005
    assert list(store.iter_objects("many/")) == []


def test_stat_many_finds_sizes_with_few_calls(store):
    keys = [f"batch/g1/file-{i}.txt" for i in range(20)]
    for i, key in enumerate(keys[:15]):
        store.put_bytes(key, b"x" * i)
    found = store.stat_many(keys)
    assert {k: o.size for k, o in found.items()} == {k: i for i, k in enumerate(keys[:15])}


def test_local_store_refuses_expired_and_tampered_urls(settings, local_store_url, db):
    settings.VERI_STORE = local_store_url
    store = get_store()
    client = APIClient()
    expired, _ = store.presign_put("k.txt", expires=-1)
    response = client.put(expired, b"x", content_type="application/octet-stream")
    assert (response.status_code, response.json()["error"]["code"]) == (403, "signature_expired")

    claims = {"op": "put", "key": "../../etc/evil", "exp": time.time() + 60}
    forged = signing.dumps(claims, salt="someone-else")
    response = client.put(f"/v1/store/{forged}", b"x", content_type="application/octet-stream")
    assert (response.status_code, response.json()["error"]["code"]) == (403, "invalid_signature")
    assert store.head("k.txt") is None

    get_only = store.presign_get("k.txt", expires=60)
    response = client.put(get_only, b"x", content_type="application/octet-stream")
    assert response.status_code == 403


def test_local_store_refuses_bodies_that_miss_their_checksum(settings, local_store_url, db):
    settings.VERI_STORE = local_store_url
    store = get_store()
    client = APIClient()
    url, _ = store.presign_put("c.txt", expires=60, sha256=hashlib.sha256(b"right").hexdigest())
    response = client.put(url, b"wrong", content_type="application/octet-stream")
    assert (response.status_code, response.json()["error"]["code"]) == (400, "bad_digest")
    assert store.head("c.txt") is None
    assert client.put(url, b"right", content_type="application/octet-stream").status_code == 200

    upload_id = store.create_multipart("m.bin")
    part_url = store.presign_part("m.bin", upload_id=upload_id, number=1, expires=60)
    md5 = base64.b64encode(hashlib.md5(b"part").digest()).decode()
    bad = client.put(
        part_url, b"tamp", content_type="application/octet-stream", headers={"Content-MD5": md5}
    )
    assert (bad.status_code, bad.json()["error"]["code"]) == (400, "bad_digest")
    good = client.put(
        part_url, b"part", content_type="application/octet-stream", headers={"Content-MD5": md5}
    )
    assert good.status_code == 200


def test_local_store_serves_byte_ranges(settings, local_store_url, db):
    settings.VERI_STORE = local_store_url
    store = get_store()
    store.put_bytes("r.bin", bytes(range(256)))
    url = store.presign_get("r.bin", expires=60)
    status, body = get_url(APIClient(), url, {"Range": "bytes=10-19"})
    assert (status, body) == (206, bytes(range(10, 20)))
    status, body = get_url(APIClient(), url, {"Range": "bytes=250-"})
    assert (status, body) == (206, bytes(range(250, 256)))


def test_local_store_keys_cannot_leave_the_store(tmp_path):
    store = LocalStore(str(tmp_path), base_url="http://testserver")
    with pytest.raises(StoreError):
        store.put_bytes("../outside.txt", b"x")
    assert not (tmp_path.parent / "outside.txt").exists()


def test_scoped_read_credentials_send_a_policy_for_that_prefix_only(s3_store_url, settings):
    settings.VERI_STORE = s3_store_url
    store = get_store()
    assert isinstance(store, S3Store)
    sent = {}
    store.sts.meta.events.register(
        "provide-client-params.sts.AssumeRole", lambda params, **kw: sent.update(params)
    )
    creds = store.scoped_credentials("workspaces/ws_a/volumes/vol_1/", ttl=1800)

    policy = json.loads(sent["Policy"])
    bucket = s3_store_url.removeprefix("s3://").split("/")[0]
    prefix = "root/workspaces/ws_a/volumes/vol_1/"
    assert sent["DurationSeconds"] == 1800
    assert policy["Statement"][0] == {
        "Effect": "Allow",
        "Action": ["s3:GetObject"],
        "Resource": [f"arn:aws:s3:::{bucket}/{prefix}*"],
    }
    assert policy["Statement"][1]["Action"] == ["s3:ListBucket"]
    assert policy["Statement"][1]["Condition"] == {"StringLike": {"s3:prefix": [f"{prefix}*"]}}
    assert not any("Put" in a or "Delete" in a for s in policy["Statement"] for a in s["Action"])
    assert creds["session_token"] and creds["prefix"] == prefix
    expiration = datetime.fromisoformat(creds["expiration"])
    assert 0 < (expiration - datetime.now(UTC)).total_seconds() <= 1800 + 5


@pytest.mark.parametrize(
    "operation, params, method, extra",
    [
        ("get_object", {}, "GET", {}),
        (
            "put_object",
            {"ChecksumSHA256": "n4bQgYhMfWWaL+qgxVrQFaO/TxsrC4Is0V1sFbDwCgg="},
            "PUT",
            {"headers": {"x-amz-checksum-sha256": "n4bQgYhMfWWaL+qgxVrQFaO/TxsrC4Is0V1sFbDwCgg="}},
        ),
        (
            "put_object",
            {"ChecksumSHA256": "n4bQgYhMfWWaL+qgxVrQFaO/TxsrC4Is0V1sFbDwCgg=", "IfNoneMatch": "*"},
            "PUT",
            {
                "headers": {
                    "x-amz-checksum-sha256": "n4bQgYhMfWWaL+qgxVrQFaO/TxsrC4Is0V1sFbDwCgg=",
                    "If-None-Match": "*",
                }
            },
        ),
        (
            "upload_part",
            {"UploadId": "abc/def+1", "PartNumber": 7},
            "PUT",
            {"params": {"uploadId": "abc/def+1", "partNumber": "7"}},
        ),
    ],
)
def test_fast_presigner_signs_exactly_like_botocore(
    s3_store_url, settings, operation, params, method, extra
):
    settings.VERI_STORE = s3_store_url
    store = get_store()
    key = "root/dir with space/ünï~code+plus.txt"
    theirs = store.client.generate_presigned_url(
        operation, Params={"Bucket": store.bucket, "Key": key, **params}, ExpiresIn=900
    )
    their_query = parse_qs(urlsplit(theirs).query)
    at = datetime.strptime(their_query["X-Amz-Date"][0], "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC)
    ours = store.presigner.url(method, key, expires=900, now=at, **extra)
    assert urlsplit(ours)._replace(query="") == urlsplit(theirs)._replace(query="")
    assert parse_qs(urlsplit(ours).query) == their_query
