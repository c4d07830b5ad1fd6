"""A stored file cannot change after it was verified. The attack that worked: start an upload of 3
bytes, PUT them, complete (3 recorded), then PUT 15 other bytes to the same signed URL, which
replaced what the volume serves. A single upload's URL now only creates its object (S3's signed
`If-None-Match: *`; the local store's signed claim), and carries the announced sha256, so on
both stores the second PUT is refused and the recorded bytes stay."""

import hashlib
import io
import threading

import httpx
import pytest
from rest_framework.test import APIClient

from tests.conftest import fill_volume
from volumes.models import VolumeFile
from volumes.stores import ObjectExists, get_store

pytestmark = pytest.mark.django_db


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def put(client: APIClient, url: str, data: bytes, headers: dict[str, str]):
    """PUT to a signed URL with the headers it was handed (what the SDK sends)."""
    headers = {**headers, "Content-Type": "application/octet-stream"}
    if url.startswith("http://testserver/"):
        return client.put(
            url.removeprefix("http://testserver"),
            data,
            content_type="application/octet-stream",
            headers={k: v for k, v in headers.items() if k != "Content-Type"},
        )
    return httpx.put(url, content=data, headers=headers)


def start(client, volume_id: str, path: str, data: bytes, *, announce_sha: bool) -> dict:
    body = {"path": path, "size": len(data)} | ({"sha256": sha(data)} if announce_sha else {})
    response = client.post(f"/v1/volumes/{volume_id}/files", body, format="json")
    assert response.status_code == 201, response.json()
    return response.json()


@pytest.mark.parametrize("announce_sha", [True, False], ids=["sha256", "size-only"])
def test_resending_a_completed_uploads_url_cannot_change_the_file(
    store_kind, api_client, workspace, announce_sha
):
    volume = fill_volume(workspace, "corpus", {"other.txt": b"x"})
    answer = start(api_client, volume.public_id, "a.txt", b"abc", announce_sha=announce_sha)
    assert answer["headers"]["If-None-Match"] == "*"
    assert put(api_client, answer["url"], b"abc", answer["headers"]).status_code == 200
    done = api_client.post(
        f"/v1/volumes/{volume.public_id}/uploads/{answer['upload_id']}/complete", {}, format="json"
    )
    assert (done.status_code, done.json()["size"]) == (200, 3)

    for other in (b"fifteen bytes!!", b"xyz", b"abc"):
        assert put(api_client, answer["url"], other, answer["headers"]).status_code == 412

    file = VolumeFile.objects.get(volume=volume, path="a.txt")
    assert (file.size, get_store().get_bytes(file.object_key)) == (3, b"abc")
    # A new upload of the path is how a file is replaced, and it still works.
    again = start(api_client, volume.public_id, "a.txt", b"new bytes", announce_sha=announce_sha)
    assert put(api_client, again["url"], b"new bytes", again["headers"]).status_code == 200
    done = api_client.post(
        f"/v1/volumes/{volume.public_id}/uploads/{again['upload_id']}/complete", {}, format="json"
    )
    assert done.json()["size"] == len(b"new bytes")


def test_the_local_store_holds_the_rule_in_its_signature_not_in_the_header(
    api_client, workspace, settings, local_store_url
):
    """The claim is signed into the URL: leaving the header out changes nothing."""
    settings.VERI_STORE = local_store_url
    volume = fill_volume(workspace, "corpus", {"other.txt": b"x"})
    answer = start(api_client, volume.public_id, "a.txt", b"abc", announce_sha=False)
    assert put(api_client, answer["url"], b"abc", {}).status_code == 200
    refused = put(api_client, answer["url"], b"fifteen bytes!!", {})
    assert (refused.status_code, refused.json()["error"]["code"]) == (412, "precondition_failed")
    assert "never rewritten" in refused.json()["error"]["message"]


def test_two_racing_create_only_writes_store_one(settings, local_store_url, db):
    settings.VERI_STORE = local_store_url
    store, results, barrier = get_store(), [], threading.Barrier(8)

    def write(index: int) -> None:
        barrier.wait()
        try:
            store.write("race.bin", io.BytesIO(bytes([index]) * 100_000), create_only=True)
            results.append(("stored", index))
        except ObjectExists:
            results.append(("refused", index))

    threads = [threading.Thread(target=write, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    [winner] = [i for outcome, i in results if outcome == "stored"]
    assert len(results) == 8
    assert store.get_bytes("race.bin") == bytes([winner]) * 100_000
