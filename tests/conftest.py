import contextlib
import os
import subprocess
import sys
import threading
import time
import uuid
from http.server import ThreadingHTTPServer
from pathlib import Path

import boto3
import httpx
import pytest
from botocore.config import Config
from django.db import connection
from rest_framework.test import APIClient

from billing.services import open_billing_account
from providers.services import get_adapter
from scripts.prod_like import free_port
from tests.stripe_fake import SECRET as STRIPE_SECRET
from tests.stripe_fake import FakeStripe
from veri import services as veri_services

os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

REPO = Path(__file__).resolve().parent.parent


# Folders whose tests train for real, drive a browser or run the production topology.
HEAVY = ("tests/e2e/", "tests/browser/", "tests/topology/")


def pytest_xdist_make_scheduler(config, log):
    """`make test` runs two xdist workers: the heavy folders' tests all go to one of them, one at a
    time, and the rest to the other beside them. Two real trainings at once on 2 cores would
    stretch the time limits those tests assert. (xdist's own loadgroup cannot do this under
    pytest 9, whose node ids it no longer rewrites.)"""
    if config.getoption("dist") != "load":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class HeavyTogether(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return "heavy" if nodeid.startswith(HEAVY) else nodeid

    return HeavyTogether(config, log)


@pytest.fixture(autouse=True)
def django_db_serialized_rollback():
    """Every transactional test puts back the rows migrations made (task schedules, content
    types) after flushing: one that does not would break the next one that does."""


@pytest.fixture(autouse=True)
def public_url(request, settings) -> str:
    """Where the test's API is reached, so the local store's signed URLs point there: the live
    server when the test runs one, else Django's test client."""
    if "live_server" in request.fixturenames:
        settings.VERI_PUBLIC_URL = request.getfixturevalue("live_server").url
    else:
        settings.VERI_PUBLIC_URL = "http://testserver"
    return settings.VERI_PUBLIC_URL


@pytest.fixture(scope="session")
def s3_endpoint():
    """The S3 server: `make test` starts one (VERI_TEST_S3_URL); a bare `pytest` starts its own."""
    if url := os.environ.get("VERI_TEST_S3_URL"):
        yield url
        return
    with moto_server() as url:
        yield url


@contextlib.contextmanager
def moto_server():
    """A moto server of its own on a free loopback port, stopped on the way out."""
    port = free_port()
    moto = REPO / ".venv" / "bin" / "moto_server"
    process = subprocess.Popen(
        [str(moto) if moto.exists() else "moto_server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    for _ in range(100):
        try:
            httpx.get(f"{url}/moto-api/")
            break
        except httpx.TransportError:
            time.sleep(0.1)
    try:
        yield url
    finally:
        process.terminate()
        process.wait()


def s3_client(endpoint: str):
    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        config=Config(signature_version="s3v4"),
    )


# moto's STS takes any role; a deployment names its own (docs/deploy.md).
TEST_STS_ROLE_ARN = "arn:aws:iam::123456789012:role/veri-worker-storage"


@pytest.fixture
def s3_store_url(s3_endpoint, settings) -> str:
    """A fresh bucket on the S3 server, with STS (scoped credentials for workers); a test of a
    store without STS sets `VERI_STS_ROLE_ARN` back to ""."""
    bucket = f"veri-test-{uuid.uuid4().hex[:12]}"
    s3_client(s3_endpoint).create_bucket(Bucket=bucket)
    settings.AWS_ENDPOINT_URL = s3_endpoint
    settings.VERI_STS_ROLE_ARN = TEST_STS_ROLE_ARN
    return f"s3://{bucket}/root"


@pytest.fixture
def local_store_url(tmp_path) -> str:
    return f"file://{tmp_path / 'store'}"


@pytest.fixture(params=["local", "s3"])
def store_kind(request, settings) -> str:
    """Runs the test once against each store; settings.VERI_STORE points at a fresh one."""
    fixture = "local_store_url" if request.param == "local" else "s3_store_url"
    settings.VERI_STORE = request.getfixturevalue(fixture)
    return request.param


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    """A tiny causal LM made here (no model hub), for real training."""
    out = tmp_path_factory.mktemp("tiny-model")
    subprocess.run(
        [sys.executable, "-m", "worker.tinymodel", str(out)],
        cwd=REPO,
        check=True,
        capture_output=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    return out


@pytest.fixture
def workspace(db):
    workspace, _ = veri_services.create_workspace(name="acme")
    return workspace


@pytest.fixture
def cloud(settings):
    """The fake `aws` provider, usable and the default."""
    settings.VERI_PROVIDER_ADAPTERS = {
        "local": "providers.local.LocalProvider",
        "aws": "tests.training.fakes.FakeCloud",
    }
    adapter = get_adapter("aws")
    adapter.reset()
    yield adapter
    adapter.reset()


@pytest.fixture
def billed(workspace):
    open_billing_account(workspace=workspace, credit_micros=100_000_000)
    return workspace


@pytest.fixture
def stripe_api(settings):
    FakeStripe.requests, FakeStripe.answers = [], {}
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeStripe)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    settings.STRIPE_SECRET_KEY = "sk_test_veri"
    settings.STRIPE_WEBHOOK_SECRET = STRIPE_SECRET
    settings.STRIPE_API_BASE = f"http://127.0.0.1:{server.server_port}"
    yield FakeStripe
    server.shutdown()


def client_for(workspace) -> APIClient:
    _, key = veri_services.create_api_key(workspace=workspace, name="test")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    client.raw_key = key
    return client


@pytest.fixture
def api_client(workspace) -> APIClient:
    return client_for(workspace)


@pytest.fixture
def other_api_client(db) -> APIClient:
    other, _ = veri_services.create_workspace(name="other")
    return client_for(other)


def put_to_url(client: APIClient, url: str, data: bytes) -> httpx.Response | object:
    """PUT to a presigned URL: the local store's are served by Django, S3's by the S3 server."""
    if url.startswith("http://testserver/"):
        return client.put(
            url.removeprefix("http://testserver"), data, content_type="application/octet-stream"
        )
    return httpx.put(url, content=data, headers={"Content-Type": "application/octet-stream"})


def get_url(client: APIClient, url: str) -> bytes:
    """GET a signed URL: the local store's through Django, S3's from the S3 server."""
    if url.startswith("http://testserver/"):
        response = client.get(url.removeprefix("http://testserver"))
        assert response.status_code == 200
        return b"".join(response.streaming_content) if response.streaming else response.content
    response = httpx.get(url)
    response.raise_for_status()
    return response.content


def assert_error(response, status: int, code: str, field: str | None = "__any__") -> dict:
    body = response.json()
    assert response.status_code == status, body
    assert body["error"]["code"] == code, body
    assert body["error"]["message"]
    if field != "__any__":
        assert body["error"]["field"] == field, body
    return body["error"]


def run_python(*args: str, env: dict | None = None, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *args],
        cwd=REPO,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        **kwargs,
    )


postgres_only = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="row locks and real concurrency need PostgreSQL"
)


def wait_for(predicate, timeout: float, what: str):
    """`predicate()`'s first truthy value, asked every 0.2 s for up to `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def in_threads(count: int, work) -> list:
    """Run `work(i)` in `count` threads released together; raise if any of them raised."""
    barrier, results, failures = threading.Barrier(count), [None] * count, []

    def run(index):
        try:
            barrier.wait()
            results[index] = work(index)
        except Exception as exc:  # noqa: BLE001 - reported below
            failures.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures, failures
    return results


def fill_volume(workspace, name: str, files: dict[str, bytes]):
    """A volume holding `files` (created, or added to when it exists), put through the real
    upload services (start, bytes into the configured store, complete)."""
    from volumes import services as volume_services
    from volumes.models import Upload, Volume
    from volumes.stores import get_store

    volume = Volume.objects.filter(workspace=workspace, name=name).first()
    if volume is None:
        volume, _ = volume_services.create_volume(workspace=workspace, name=name)
    started = volume_services.start_uploads(
        volume=volume,
        files=[
            volume_services.FileToUpload(path=path, size=len(data)) for path, data in files.items()
        ],
    )
    ids = [answer["upload_id"] for answer in started]
    uploads = {u.public_id: u for u in Upload.objects.filter(volume=volume, public_id__in=ids)}
    for answer, data in zip(started, files.values(), strict=True):
        get_store().put_bytes(uploads[answer["upload_id"]].object_key, data)
    volume = Volume.objects.select_related("workspace").get(pk=volume.pk)
    volume_services.complete_uploads(
        volume=volume, completions=[volume_services.Completion(u) for u in uploads.values()]
    )
    volume.refresh_from_db()
    return volume


@pytest.fixture
def no_sts(settings, s3_store_url) -> list[str]:
    """The S3 store with no role to assume (deploy.md's store without STS), its STS endpoint
    unreachable. Returns the STS operations anything tried (none, if all is well)."""
    from botocore.exceptions import EndpointConnectionError

    from volumes.stores import S3Store, get_store

    settings.VERI_STORE = s3_store_url
    settings.VERI_STS_ROLE_ARN = ""
    store = get_store()
    assert isinstance(store, S3Store)
    tried: list[str] = []

    def unreachable(model, **kwargs):
        tried.append(model.name)
        raise EndpointConnectionError(endpoint_url="https://sts.unreachable.invalid")

    store.sts.meta.events.register("before-call.sts", unreachable)
    yield tried
    store.sts.meta.events.unregister("before-call.sts", unreachable)
