"""An S3 store without STS (Runpod's, many MinIO setups): no role is configured, so workers read
their volumes through a presigned GET URL per file and write their outputs through presigned
PUTs, with the same lifetimes and the same checks, and the store's STS is never called."""

import base64
import hashlib
from datetime import UTC, datetime, timedelta
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest

from tests.conftest import s3_client
from training import tasks
from training.models import Checkpoint
from training.services.worker import mint_job_token
from volumes import services as volume_services
from volumes.models import Upload, Volume
from volumes.stores import get_store
from worker.client import ControlPlane
from worker.errors import JobFailure
from worker.volumes import mount_volumes, sync_volume

FILES = {"a.txt": b"alpha", "data/train.jsonl": b'{"text": "hello"}\n' * 200}


@pytest.fixture
def no_sts(dataset, no_sts) -> list[str]:
    """tests/conftest.py's store without STS, set after `dataset` (which puts the job's dataset
    in a local store of its own)."""
    return no_sts


def upload_volume(workspace, name: str, files: dict[str, bytes]) -> Volume:
    """A volume uploaded as a client does: each file announced with its sha256, PUT to its
    presigned URL, completed."""
    volume, _ = volume_services.create_volume(workspace=workspace, name=name)
    started = volume_services.start_uploads(
        volume=volume,
        files=[
            volume_services.FileToUpload(
                path=path, size=len(data), sha256=hashlib.sha256(data).hexdigest()
            )
            for path, data in files.items()
        ],
    )
    for answer, data in zip(started, files.values(), strict=True):
        headers = {**answer["headers"], "Content-Type": "application/octet-stream"}
        httpx.put(answer["url"], content=data, headers=headers).raise_for_status()
    ids = [answer["upload_id"] for answer in started]
    volume_services.complete_uploads(
        volume=volume,
        completions=[
            volume_services.Completion(u)
            for u in Upload.objects.filter(volume=volume, public_id__in=ids)
        ],
    )
    return Volume.objects.select_related("workspace").get(pk=volume.pk)


@pytest.mark.django_db(transaction=True)
def test_a_worker_syncs_and_uploads_through_presigned_urls_without_sts(
    no_sts, workspace, submit, live_server, tmp_path
):
    volume = upload_volume(workspace, "corpus", FILES)
    job = submit(volumes=["corpus"])
    tasks.provision_job(job_id=job.pk)
    token = mint_job_token(job=job)
    api = ControlPlane(api_url=live_server.url, job_id=job.public_id, token=token)

    answer = api.call("POST", "/volume-credentials")
    [mounted] = answer["volumes"]
    credentials = mounted["credentials"]
    assert credentials["kind"] == "signed_urls" and set(credentials) == {"kind", "expiration"}
    lifetime = datetime.fromisoformat(credentials["expiration"]) - datetime.now(UTC)
    assert timedelta(seconds=1790) < lifetime <= timedelta(seconds=answer["ttl_seconds"])
    for file in mounted["files"]:  # a URL per file, for that object only, signed for as long
        assert "X-Amz-Expires=1800" in file["url"] and "key" not in file
        assert urlsplit(file["url"]).path.endswith(f"/{get_store().root}{file['object_key']}")

    # The worker's own sync, through the API: every file arrives and is checked by its sha256.
    mounts = mount_volumes(api, tmp_path / "mnt", lambda _: None)
    for path, data in FILES.items():
        assert (mounts["corpus"] / path).read_bytes() == data

    # URLs about to expire are renewed before a download starts, as credentials are (these
    # point nowhere: only the renewed ones can fetch the files).
    stale = mounted | {
        "credentials": {**credentials, "expiration": datetime.now(UTC).isoformat()},
        "files": [
            f | {"url": f["url"].replace(f"/{volume.public_id}/", f"/{volume.public_id}-gone/")}
            for f in mounted["files"]
        ],
    }
    renewed = sync_volume(api, stale, tmp_path / "renewed", lambda _: None)
    assert (renewed / "a.txt").read_bytes() == FILES["a.txt"]

    # Bytes that changed in the store (same size) fail the sync, as with STS credentials.
    bucket, root = get_store().bucket, get_store().root
    key = next(f["object_key"] for f in mounted["files"] if f["path"] == "a.txt")
    s3_client(get_store().endpoint_url).put_object(Bucket=bucket, Key=root + key, Body=b"omega")
    with pytest.raises(JobFailure) as changed:
        mount_volumes(api, tmp_path / "again", lambda _: None)
    assert changed.value.code == "volume_sync_incomplete"
    assert "a.txt (sha256 differs from the uploaded file's)" in changed.value.message

    # Outputs go up through presigned PUTs bound to their sha256, then are recorded.
    weights = b"weights" * 100
    digest = hashlib.sha256(weights).hexdigest()
    [target] = api.call(
        "POST",
        "/output-credentials",
        json={"files": [{"path": "final/adapter_model.safetensors", "sha256": digest}]},
    )["files"]
    # S3 refuses other bytes: their sha256 is a signed header (moto checks neither).
    expected = base64.b64encode(bytes.fromhex(digest)).decode()
    assert target["headers"] == {"x-amz-checksum-sha256": expected}
    assert (
        "x-amz-checksum-sha256" in parse_qs(urlsplit(target["url"]).query)["X-Amz-SignedHeaders"][0]
    )
    headers = {**target["headers"], "Content-Type": "application/octet-stream"}
    httpx.put(target["url"], content=weights, headers=headers).raise_for_status()
    api.call(
        "POST",
        "/checkpoints",
        json={
            "step": 1,
            "final": True,
            "files": [{"path": "adapter_model.safetensors", "size": len(weights)}],
        },
    )
    assert Checkpoint.objects.get(job=job, final=True).size_bytes == len(weights)
    stored = job.output_prefix.key("final/adapter_model.safetensors")
    assert get_store().get_bytes(stored) == weights
    assert no_sts == []  # nothing asked STS for credentials
