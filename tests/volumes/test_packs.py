"""Small files sent in packs: one PUT for many, each file still checked against its sha256."""

import hashlib
from datetime import timedelta

import httpx
import pytest
from django.utils import timezone

from tests.conftest import assert_error
from volumes import services, tasks
from volumes.models import StoreDeletion, Upload, Volume, VolumeFile
from volumes.stores import get_store

pytestmark = pytest.mark.django_db


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def put(client, url: str, data: bytes, headers: dict[str, str]):
    """PUT to a presigned URL with the headers it was signed with (If-None-Match: *)."""
    if url.startswith("http://testserver/"):
        extra = {f"HTTP_{k.upper().replace('-', '_')}": v for k, v in headers.items()}
        path, extra["CONTENT_LENGTH"] = url.removeprefix("http://testserver"), str(len(data))
        return client.put(path, data, content_type="application/octet-stream", **extra)
    return httpx.put(url, content=data, headers=headers)


def start(client, volume_id: str, files: dict[str, bytes], **extra) -> dict:
    body = {
        "files": [{"path": p, "size": len(d), "sha256": sha(d)} for p, d in files.items()],
        "pack": True,
    }
    answer = client.post(f"/v1/volumes/{volume_id}/uploads:batch", body | extra, format="json")
    assert answer.status_code == 201, answer.json()
    return answer.json()


def complete(client, volume_id: str, answers: list[dict]) -> dict[str, dict]:
    body = {"uploads": [{"upload_id": a["upload_id"]} for a in answers]}
    done = client.post(f"/v1/volumes/{volume_id}/uploads:complete", body, format="json")
    assert done.status_code == 200, done.json()
    paths = {a["upload_id"]: a["path"] for a in answers}
    return {paths[item["upload_id"]]: item for item in done.json()["data"]}


def upload_packed(client, volume_id: str, files: dict[str, bytes]) -> dict[str, dict]:
    """Start, send each pack (its files' bytes in the order of their offsets), complete."""
    started = start(client, volume_id, files)
    for index, pack in enumerate(started["packs"]):
        members = sorted(
            (a for a in started["data"] if a.get("pack") == index), key=lambda a: a["offset"]
        )
        body = b"".join(files[a["path"]] for a in members)
        assert put(client, pack["url"], body, pack["headers"]).status_code == 200
    return complete(client, volume_id, started["data"])


def stored(file: VolumeFile) -> bytes:
    return get_store().get_bytes(file.object_key, byte_range=file.byte_range)


def test_small_files_go_in_one_pack_and_each_reads_back(api_client, store_kind):
    volume = api_client.post("/v1/volumes", {"name": "corpus"}, format="json").json()
    small = {f"rows/{n}.jsonl": f'{{"n": {n}}}\n'.encode() * (n + 1) for n in range(5)}
    large, empty = b"x" * (services.PACK_FILE_MAX_BYTES + 1), b""
    started = start(api_client, volume["id"], small | {"large.bin": large, "empty.txt": empty})
    methods = {a["path"]: a["method"] for a in started["data"]}
    assert methods == dict.fromkeys(small, "packed") | {
        "large.bin": "single",
        "empty.txt": "single",
    }
    [pack] = started["packs"]
    offsets = [a["offset"] for a in started["data"] if a["method"] == "packed"]
    assert offsets == [sum(map(len, list(small.values())[:n])) for n in range(5)]
    assert pack["size"] == sum(map(len, small.values()))

    assert (
        put(api_client, pack["url"], b"".join(small.values()), pack["headers"]).status_code == 200
    )
    for answer in started["data"][5:]:
        data = large if answer["path"] == "large.bin" else empty
        assert put(api_client, answer["url"], data, answer["headers"]).status_code == 200
    done = complete(api_client, volume["id"], started["data"])
    assert all(item["ok"] for item in done.values()), done
    assert done["rows/3.jsonl"]["file"]["sha256"] == sha(small["rows/3.jsonl"])

    files = {f.path: f for f in VolumeFile.objects.all()}
    for path, data in small.items():
        assert (stored(files[path]), files[path].sha256_verified) == (data, True)
    assert len({files[p].object_key for p in small}) == 1
    assert files["large.bin"].offset is None and stored(files["large.bin"]) == large
    got = api_client.get(f"/v1/volumes/{volume['id']}").json()
    assert (got["file_count"], got["total_bytes"]) == (
        7,
        sum(map(len, small.values())) + len(large),
    )

    # The same files again: skipped, nothing packed.
    again = start(api_client, volume["id"], small)
    assert again["packs"] == [] and all(a["skipped"] for a in again["data"])


def test_without_pack_every_file_is_its_own_put(api_client, local_store_url, settings):
    settings.VERI_STORE = local_store_url
    volume = api_client.post("/v1/volumes", {"name": "corpus"}, format="json").json()
    body = {"files": [{"path": "a.txt", "size": 1, "sha256": sha(b"a")}]}
    answer = api_client.post(f"/v1/volumes/{volume['id']}/uploads:batch", body, format="json")
    assert [a["method"] for a in answer.json()["data"]] == ["single"]
    assert "packs" not in answer.json()


def test_packs_stay_under_their_size(api_client, local_store_url, settings, monkeypatch):
    settings.VERI_STORE = local_store_url
    monkeypatch.setattr(services, "PACK_MAX_BYTES", 10)
    volume = api_client.post("/v1/volumes", {"name": "corpus"}, format="json").json()
    files = {"a": b"aaaa", "b": b"bbbb", "c": b"cccc", "d": b"dddddddddd"}
    started = start(api_client, volume["id"], files)
    assert [p["size"] for p in started["packs"]] == [8, 4, 10]
    assert [(a["pack"], a["offset"]) for a in started["data"]] == [(0, 0), (0, 4), (1, 0), (2, 0)]
    done = upload_packed(api_client, volume["id"], files)
    assert all(item["ok"] for item in done.values())
    assert {f.path: stored(f) for f in VolumeFile.objects.all()} == files


def test_a_packed_file_whose_bytes_differ_is_refused_and_the_others_kept(api_client, store_kind):
    volume = api_client.post("/v1/volumes", {"name": "corpus"}, format="json").json()
    assert upload_packed(api_client, volume["id"], {"b.txt": b"the old b"})["b.txt"]["ok"]
    files = {"a.txt": b"first", "b.txt": b"second", "c.txt": b"third"}
    started = start(api_client, volume["id"], files)
    [pack] = started["packs"]
    lie = b"first" + b"SECOND" + b"third"  # b.txt's bytes are not those of its sha256
    assert put(api_client, pack["url"], lie, pack["headers"]).status_code == 200
    done = complete(api_client, volume["id"], started["data"])
    assert (done["a.txt"]["ok"], done["c.txt"]["ok"], done["b.txt"]["ok"]) == (True, True, False)
    assert done["b.txt"]["error"]["code"] == "upload_incomplete"
    assert "differ from its sha256" in done["b.txt"]["error"]["message"]
    tasks.reconcile_deleted_volumes()  # the pack holds a.txt and c.txt: it stays
    found = {f.path: stored(f) for f in VolumeFile.objects.all()}
    assert found == {"a.txt": b"first", "b.txt": b"the old b", "c.txt": b"third"}
    assert Volume.objects.get().total_bytes == len(b"firstthirdthe old b")


@pytest.mark.parametrize("sent", [b"onetwo" + b"!" * 1000, b"onetw"], ids=["longer", "shorter"])
def test_a_pack_of_another_size_records_nothing_and_leaves(api_client, store_kind, sent):
    volume = api_client.post("/v1/volumes", {"name": "corpus"}, format="json").json()
    started = start(api_client, volume["id"], {"one": b"one", "two": b"two"})
    [pack] = started["packs"]
    assert put(api_client, pack["url"], sent, pack["headers"]).status_code == 200
    done = complete(api_client, volume["id"], started["data"])
    for item in done.values():
        assert not item["ok"]
        assert f"its pack holds {len(sent)} bytes, expected 6" in item["error"]["message"]
    assert not VolumeFile.objects.exists()
    key = Upload.objects.first().object_key
    assert StoreDeletion.objects.filter(key=key).count() == 1  # once for the pack's two files
    tasks.reconcile_deleted_volumes()
    assert get_store().head(key) is None


def test_a_pack_never_sent_is_nothing_uploaded(api_client, store_kind):
    volume = api_client.post("/v1/volumes", {"name": "corpus"}, format="json").json()
    started = start(api_client, volume["id"], {"one": b"one"})
    done = complete(api_client, volume["id"], started["data"])
    assert "nothing was uploaded" in done["one"]["error"]["message"]


def test_a_completed_packs_url_cannot_change_its_files(api_client, store_kind):
    volume = api_client.post("/v1/volumes", {"name": "corpus"}, format="json").json()
    started = start(api_client, volume["id"], {"one": b"one", "two": b"two"})
    [pack] = started["packs"]
    assert put(api_client, pack["url"], b"onetwo", pack["headers"]).status_code == 200
    assert all(item["ok"] for item in complete(api_client, volume["id"], started["data"]).values())
    assert put(api_client, pack["url"], b"ONETWO", pack["headers"]).status_code == 412
    assert {f.path: stored(f) for f in VolumeFile.objects.all()} == {"one": b"one", "two": b"two"}


def test_a_pack_stays_while_any_of_its_files_does(api_client, store_kind):
    volume = api_client.post("/v1/volumes", {"name": "corpus"}, format="json").json()
    upload_packed(api_client, volume["id"], {"a": b"old a", "b": b"old b"})
    old_pack = VolumeFile.objects.get(path="a").object_key
    upload_packed(api_client, volume["id"], {"a": b"new a"})
    tasks.reconcile_deleted_volumes()
    assert get_store().head(old_pack) is not None  # b still reads from it
    assert stored(VolumeFile.objects.get(path="b")) == b"old b"
    upload_packed(api_client, volume["id"], {"b": b"new b"})
    tasks.reconcile_deleted_volumes()
    assert get_store().head(old_pack) is None
    assert {f.path: stored(f) for f in VolumeFile.objects.all()} == {"a": b"new a", "b": b"new b"}


def test_an_aborted_file_leaves_its_pack_to_the_others(api_client, store_kind):
    volume = api_client.post("/v1/volumes", {"name": "corpus"}, format="json").json()
    started = start(api_client, volume["id"], {"one": b"one", "two": b"two"})
    [pack] = started["packs"]
    assert put(api_client, pack["url"], b"onetwo", pack["headers"]).status_code == 200
    first = started["data"][0]["upload_id"]
    assert api_client.delete(f"/v1/volumes/{volume['id']}/uploads/{first}").status_code == 204
    tasks.reconcile_deleted_volumes()  # "two" is still on its way: the pack stays
    done = complete(api_client, volume["id"], started["data"][1:])
    assert done["two"]["ok"], done
    assert {f.path: stored(f) for f in VolumeFile.objects.all()} == {"two": b"two"}
    assert_error(
        api_client.post(f"/v1/volumes/{volume['id']}/uploads/{first}/complete", {}, format="json"),
        409,
        "upload_aborted",
    )


def test_an_abandoned_pack_is_aborted_once_and_leaves(api_client, store_kind):
    volume = api_client.post("/v1/volumes", {"name": "corpus"}, format="json").json()
    started = start(api_client, volume["id"], {"one": b"one", "two": b"two"})
    [pack] = started["packs"]
    assert put(api_client, pack["url"], b"onetwo", pack["headers"]).status_code == 200
    key = Upload.objects.first().object_key
    assert tasks.abort_stale_uploads(now=timezone.now() + timedelta(days=2)) == 2
    assert StoreDeletion.objects.filter(key=key).count() == 1
    tasks.reconcile_deleted_volumes()
    assert get_store().head(key) is None and not VolumeFile.objects.exists()


def test_completing_a_packs_files_one_by_one_reads_each_once(api_client, store_kind, monkeypatch):
    from volumes.stores.scoped import ScopedStore

    volume = api_client.post("/v1/volumes", {"name": "corpus"}, format="json").json()
    files = {"a": b"a" * 100, "b": b"b" * 200, "c": b"c" * 300}
    started = start(api_client, volume["id"], files)
    [pack] = started["packs"]
    assert (
        put(api_client, pack["url"], b"".join(files.values()), pack["headers"]).status_code == 200
    )
    read, get_bytes = [], ScopedStore.get_bytes

    def counting(self, key, *, byte_range=None):
        data = get_bytes(self, key, byte_range=byte_range)
        read.append(len(data))
        return data

    monkeypatch.setattr(ScopedStore, "get_bytes", counting)
    for answer in started["data"]:
        assert complete(api_client, volume["id"], [answer])[answer["path"]]["ok"]
    assert read == [100, 200, 300]  # the pack once in all, not once per file
    assert {f.path: stored(f) for f in VolumeFile.objects.all()} == files


def test_a_pack_sent_again_after_its_deletion_is_deleted_again(api_client, store_kind, settings):
    """A pack's URL works for VERI_PRESIGN_TTL_SECONDS: a client can create the object again
    after the reconciler deleted it, so the deletion is repeated once the URL has expired."""
    volume = api_client.post("/v1/volumes", {"name": "corpus"}, format="json").json()
    started = start(api_client, volume["id"], {"one": b"one", "two": b"two"})
    [pack] = started["packs"]
    for answer in started["data"]:
        url = f"/v1/volumes/{volume['id']}/uploads/{answer['upload_id']}"
        assert api_client.delete(url).status_code == 204
    key = Upload.objects.first().object_key
    tasks.reconcile_deleted_volumes()
    for deletion in StoreDeletion.objects.filter(key=key):  # one per file aborted
        assert deletion.done_at is None and deletion.not_before > timezone.now()
    assert get_store().head(key) is None

    assert put(api_client, pack["url"], b"x" * 5000, pack["headers"]).status_code == 200
    tasks.reconcile_deleted_volumes()  # not yet: the URL still works
    assert get_store().head(key).size == 5000
    Upload.objects.update(created_at=timezone.now() - timedelta(hours=2))
    StoreDeletion.objects.update(not_before=timezone.now())
    tasks.reconcile_deleted_volumes()
    assert get_store().head(key) is None
    assert not StoreDeletion.objects.filter(key=key, done_at__isnull=True).exists()
