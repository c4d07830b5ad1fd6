import atexit
import contextlib
import fcntl
import functools
import itertools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from hashlib import sha256
from http.server import ThreadingHTTPServer
from pathlib import Path

import boto3
import httpx
import pytest
from botocore.config import Config
from django.core import serializers
from django.db import connection, connections, transaction
from django.test.testcases import LiveServerThread
from pytest_django.plugin import blocking_manager_key, validate_django_db
from rest_framework.test import APIClient

from billing.services import open_billing_account
from config import devserver
from providers.services import get_adapter
from scripts.prod_like import free_port
from tests.stripe_fake import SECRET as STRIPE_SECRET
from tests.stripe_fake import FakeStripe
from veri import services as veri_services

os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# One torch thread for each training, Tinker and serving process the tests start: the tiny model
# gains nothing from a second one, and on `make test`'s two cores (every worker busy) a second
# thread spinning for its share of the other core cost a training process a quarter of its CPU.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# Bytecode written and reused, whatever the shell says: with PYTHONDONTWRITEBYTECODE set, each
# xdist worker rewrote the asserts of 400 test modules afresh (17 CPU-s to collect, 11.6 with
# the rewritten ones kept), and every process the tests start compiled the project's modules.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False
# The live server answers as runserver does, without Nagle's 40 ms on each kept-alive request
# (config/devserver.py): every call of the workers, Tinker's loops and the CLI waited it out.
LiveServerThread.server_class = devserver.ThreadedWSGIServer

REPO = Path(__file__).resolve().parent.parent


# The suite's two lanes (CONTRIBUTING.md, "Test"): a test that trains the tiny model with the
# real worker under a running task cluster (it asks, directly or through another fixture, for
# `tiny_model` and for `qcluster` or `prod_like`) is heavy; every other test is light.
TRAINS_ON = {"qcluster", "prod_like"}
# Each test's measured seconds (setup, call and teardown), to run the longest first;
# `make test PYTEST_ARGS=--record-durations` writes it again.
DURATIONS = REPO / "tests" / "durations.json"
# Modules whose tests share something machine-wide, so they run on one worker one after another:
# the vLLM launcher's serve on the machine's fixed ports (worker.serve_vllm.PORTS), which two
# launchers started at once on different workers could both pick.
ONE_WORKER_MODULES = {"tests/serving/test_vllm_launcher.py"}
FLUSHED = pytest.StashKey[bool]()  # the last test of this process emptied the database


def is_heavy(item) -> bool:
    names = set(getattr(item, "fixturenames", ()))
    return "tiny_model" in names and bool(names & TRAINS_ON)


def pytest_addoption(parser):
    parser.addoption(
        "--record-durations",
        action="store_true",
        help=f"write each test's seconds to {DURATIONS.relative_to(REPO)} at the end",
    )


def pytest_configure_node(node):
    """(xdist, in the controller) Where the workers say which tests are heavy: the scheduler
    sees only test ids, not the fixtures a test asks for."""
    config = node.config
    if not hasattr(config, "veri_lanes"):
        config.veri_lanes = Path(tempfile.mkdtemp(prefix="veri-lanes-"))
    node.workerinput["veri_lanes"] = str(config.veri_lanes)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    """Longest first: the heavy tests, then the heavy lane's shortest modules (its tail, for a
    second worker: `pytest_xdist_make_scheduler`), then the light ones; each lane's modules by
    their measured seconds (a module's tests stay together, for fixtures a module shares), and in
    the heavy lane a module's tests too. A test not measured yet counts as its lane's mean."""
    known = json.loads(DURATIONS.read_text()) if DURATIONS.exists() else {}
    heavy = {item.nodeid for item in items if is_heavy(item)}
    mean = {
        lane: statistics.fmean(
            [known[i.nodeid] for i in items if i.nodeid in known and (i.nodeid in heavy) == lane]
            or [1.0]
        )
        for lane in (True, False)
    }

    def seconds(item) -> float:
        return known.get(item.nodeid, mean[item.nodeid in heavy])

    modules: dict[tuple[bool, str], float] = {}
    for item in items:
        key = (item.nodeid in heavy, item.nodeid.split("::")[0])
        modules[key] = modules.get(key, 0.0) + seconds(item)
    order = {item.nodeid: position for position, item in enumerate(items)}

    # The tail: the heavy lane's shortest modules, run from the start on a second worker (so never
    # more than two trainings at once), as long as makes every worker end together: with n
    # workers, the light tests filling the others, H - t = (L + t) / (n - 1).
    workers = max(2, getattr(config, "workerinput", {}).get("workercount", 2))
    heavy_seconds = sum(v for (lane, _), v in modules.items() if lane)
    light_seconds = sum(v for (lane, _), v in modules.items() if not lane)
    spare, tail = (heavy_seconds * (workers - 1) - light_seconds) / workers, set()
    for (lane, module), total in sorted(modules.items(), key=lambda kv: kv[1]):
        if lane and total <= spare:
            spare -= total
            tail.add(module)

    def rank(item):
        lane = item.nodeid in heavy
        module = item.nodeid.split("::")[0]
        group = (1 if module in tail else 0) if lane else 2
        within = -seconds(item) if lane else order[item.nodeid]
        return (group, -modules[(lane, module)], module, within)

    items.sort(key=rank)
    config.veri_heavy = heavy
    config.veri_tail = {i for i in heavy if i.split("::")[0] in tail}
    if lanes := getattr(config, "workerinput", {}).get("veri_lanes"):
        said = {"heavy": sorted(heavy), "tail": sorted(config.veri_tail)}
        Path(lanes, f"{config.workerinput['workerid']}.json").write_text(json.dumps(said))


def pytest_xdist_make_scheduler(config, log):
    """`make test` runs three xdist workers: the heavy tests go to one of them, one at a time, the
    heavy lane's tail to a second one (then light tests), and the light ones to whichever is free.
    More than two real trainings at once would stretch the time limits those tests assert (three
    at once, the tail's modules spread at the end of a run, slowed every lane); two, with one
    torch thread each, leave the light tests a share of the two cores. (xdist's own loadgroup
    cannot do this under pytest 9, whose node ids it no longer rewrites.)"""
    if config.getoption("dist") != "load":
        return None
    from xdist.scheduler import LoadScopeScheduling

    config.option.loadscopereorder = False  # the queue in the collection's order

    class HeavyTogether(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            if nodeid in heavy_tests(config, "tail"):
                return "heavy tail"
            if nodeid in heavy_tests(config):
                return "heavy"
            module = nodeid.split("::")[0]
            return module if module in ONE_WORKER_MODULES else nodeid

    return HeavyTogether(config, log)


def heavy_tests(config, part: str = "heavy") -> set[str]:
    """The heavy tests' ids (or its tail's): as this process collected them, or under xdist as
    the workers did (each the same tests, xdist checks, before the scheduler first asks)."""
    if not hasattr(config, "veri_heavy"):
        lanes = getattr(config, "veri_lanes", None)
        said = next(lanes.glob("*.json"), None) if lanes else None
        lists = json.loads(said.read_text()) if said else {}
        config.veri_heavy = set(lists.get("heavy", ()))
        config.veri_tail = set(lists.get("tail", ()))
    return config.veri_heavy if part == "heavy" else config.veri_tail


class LaneSeconds:
    """Each test's seconds as reports arrive (in the controller under xdist): the lanes' sums at
    the end of the run, and the durations file when asked."""

    def __init__(self):
        self.seconds: dict[str, float] = {}
        self.heavy: set[str] = set()

    def pytest_runtest_logreport(self, report):
        self.seconds[report.nodeid] = self.seconds.get(report.nodeid, 0.0) + report.duration

    def pytest_terminal_summary(self, terminalreporter, config):
        if not self.seconds:
            return
        heavy = heavy_tests(config)
        for name, ids in (("heavy", heavy), ("light", self.seconds.keys() - heavy)):
            total = sum(self.seconds.get(i, 0.0) for i in ids)
            terminalreporter.write_line(f"{name} lane: {len(ids)} tests, {total:.0f} s in all")
        if config.getoption("record_durations"):  # what ran replaces what was recorded of it
            known = json.loads(DURATIONS.read_text()) if DURATIONS.exists() else {}
            known |= {k: round(v, 1) for k, v in self.seconds.items()}
            DURATIONS.write_text(json.dumps(dict(sorted(known.items())), indent=0) + "\n")


def pytest_configure(config):
    if not hasattr(config, "workerinput"):
        config.pluginmanager.register(LaneSeconds(), "veri-lane-seconds")
        return
    # An xdist worker has sent every result by the time it exits, and the run waits for the last
    # one to end: tearing down its interpreter (a gigabyte of objects, torch's among them) took
    # 3-5 s, three workers at once on two cores. Registered now, it runs after the exit handlers
    # the tests registered (the Tinker, W&B and model-process ones).
    atexit.register(os._exit, 0)


def pytest_unconfigure(config):
    if lanes := getattr(config, "veri_lanes", None):
        shutil.rmtree(lanes, ignore_errors=True)


def flushes_the_database(item) -> bool:
    """Whether `item` is a transactional test (pytest-django's rule): it ends by emptying every
    table, and with serialized rollback the migrations' rows come back only when the next
    transactional test starts."""
    marker = item.get_closest_marker("django_db")
    transactional = bool(marker and validate_django_db(marker)[0])
    return transactional or bool({"transactional_db", "live_server"} & set(item.fixturenames))


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """A test in a transaction after a transactional one on this worker (the heavy worker takes
    light tests once its lane is done) gets the migrations' rows back first: content types,
    permissions, task schedules. Without them an operator given permissions has none."""
    if flushes_the_database(item):
        item.config.stash[FLUSHED] = True
        return
    uses_db = item.get_closest_marker("django_db") or "db" in item.fixturenames
    if not uses_db or not item.config.stash.get(FLUSHED, False):
        return
    item.config.stash[FLUSHED] = False
    with item.config.stash[blocking_manager_key].unblock():
        for connection in connections.all():
            if serialized := getattr(connection, "_test_serialized_contents", None):
                connection.creation.deserialize_db_from_string(serialized)


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup, django_db_blocker):
    """pytest-django's, then a flush deletes rows (`flush_by_delete`), and the migrations' rows
    (content types, permissions, task schedules) come back after it with one INSERT per table:
    Django's restore saves them one by one, an UPDATE then an INSERT each, 0.35 s (half of it
    the database's) before each of the ~200 transactional tests.

    The live server's connections are kept between requests (as docs/deploy.md runs production),
    for the life of the HTTP connection that brought them. Closed after each, every call of the
    workers' (each heartbeat, log batch, Tinker poll) opened one: 6,400 in a run of the suite
    instead of 1,600, and ~150 CPU-s more, most of it connecting in the test processes."""
    for each in connections.all():
        connections.settings[each.alias]["CONN_MAX_AGE"] = 60  # what new (server) threads get
        if getattr(each, "_test_serialized_contents", None):
            each.creation.deserialize_db_from_string = functools.partial(insert_serialized, each)
        if each.vendor == "postgresql":
            each.ops.sql_flush = functools.partial(flush_by_delete, each.ops)
    yield
    # A server thread outlives the run's last request while its client keeps the HTTP connection
    # open, and so does its database connection: the test database could not be dropped.
    with django_db_blocker.unblock():
        for each in connections.all():
            if each.vendor == "postgresql":
                with each.cursor() as cursor:
                    cursor.execute(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                        "WHERE datname = current_database() AND pid <> pg_backend_pid()"
                    )


def flush_by_delete(ops, style, tables, *, reset_sequences=False, allow_cascade=False):
    """The SQL of a flush after a transactional test: a DELETE per table, triggers (the ledger's
    append-only one, the foreign keys') off for it, where PostgreSQL's TRUNCATE of all ~70
    tables takes 0.14 s for the few rows a test leaves; 0.01 s."""
    if reset_sequences:
        return type(ops).sql_flush(
            ops, style, tables, reset_sequences=True, allow_cascade=allow_cascade
        )
    deletes = [f"DELETE FROM {ops.quote_name(table)}" for table in tables]
    replica, origin = (f"SET LOCAL session_replication_role = {r}" for r in ("replica", "origin"))
    return [replica, *deletes, origin]


def insert_serialized(connection, data: str) -> None:
    """Put back the rows of `data` (a serialized database): after a flush, or over the same
    rows where no test flushed the database yet (each row there is kept)."""
    with transaction.atomic(using=connection.alias):
        for model, objects in serialized_objects(data, connection.alias):
            model._base_manager.using(connection.alias).bulk_create(objects, ignore_conflicts=True)


@functools.cache
def serialized_objects(data: str, alias: str) -> list[tuple[type, list]]:
    rows = list(serializers.deserialize("json", data, using=alias))
    assert not any(row.m2m_data for row in rows), "many-to-many rows need Django's own restore"
    objects = (row.object for row in rows)
    return [(model, list(group)) for model, group in itertools.groupby(objects, key=type)]


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


@pytest.fixture(autouse=True)
def fast_password_hasher(settings):
    """Passwords hashed with MD5 in this process: Django's PBKDF2 (a million rounds) takes 0.2 s
    of CPU for each user made and each sign-in, and the tests are about who gets in, not about
    the hash's cost."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


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
    """A tiny causal LM made here (no model hub), for real training: made once per run, in the
    folder the xdist workers' temporary folders share, by whichever worker asks first (the others
    wait on the lock). Read only: nothing writes into it."""
    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent
    out = shared / "tiny-model"
    with open(shared / "tiny-model.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (made := shared / "tiny-model.made").exists():
            subprocess.run(
                [sys.executable, "-m", "worker.tinymodel", str(out)],
                cwd=REPO,
                check=True,
                capture_output=True,
                env={**os.environ, "HF_HUB_OFFLINE": "1"},
            )
            made.touch()
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


# Hub ids the fast tests deploy on the local provider, whose offline workers load a hub id only
# from the machine's cache: a config-only snapshot of each makes it loadable, as
# `model_problem` checks (no test loads their weights; the real worker tests train from volumes).
CACHED_HUB_IDS = (
    "Qwen/Qwen2.5-0.5B",
    "Qwen/Qwen2.5-0.5B-Instruct",
    "Qwen/Qwen2.5-1.5B",
    "other/model",
    "acme/custom-base",
    "acme/broken",
    "fuzz/base",
    "tiny/model",
)


@pytest.fixture(scope="session")
def _hub_cache(tmp_path_factory) -> Path:
    cache = tmp_path_factory.mktemp("hub")
    for repo_id in CACHED_HUB_IDS:
        snapshot = cache / f"models--{repo_id.replace('/', '--')}" / "snapshots" / "test"
        snapshot.mkdir(parents=True)
        (snapshot / "config.json").write_text("{}")
    return cache


@pytest.fixture(autouse=True)
def hub_cache(_hub_cache, settings) -> Path:
    settings.VERI_LOCAL_HF_CACHE = str(_hub_cache)
    return _hub_cache


@pytest.fixture
def billed(workspace):
    open_billing_account(workspace=workspace, credit_micros=100_000_000)
    return workspace


def serve_in_background(server: ThreadingHTTPServer) -> ThreadingHTTPServer:
    """`server` answering from a daemon thread. Its shutdown() returns within 50 ms: with
    serve_forever's default poll of 0.5 s, each of the suite's fakes took half a second to stop."""
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    return server


@pytest.fixture
def stripe_api(settings):
    FakeStripe.requests, FakeStripe.answers = [], {}
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeStripe)
    serve_in_background(server)
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


def fill_volume(workspace, name: str, files: dict[str, bytes], *, packed: bool = True):
    """A volume holding `files` (created, or added to when it exists), put through the real
    upload services (start, bytes into the configured store, complete): the small ones in packs,
    as `veri volumes upload-dir` sends them, unless `packed` is False."""
    from volumes import services as volume_services
    from volumes.models import Upload, Volume
    from volumes.stores import get_store

    volume = Volume.objects.filter(workspace=workspace, name=name).first()
    if volume is None:
        volume, _ = volume_services.create_volume(workspace=workspace, name=name)
    announced = [
        volume_services.FileToUpload(path=path, size=len(data), sha256=sha256(data).hexdigest())
        for path, data in files.items()
    ]
    if packed:
        started, _ = volume_services.start_packed_uploads(volume=volume, files=announced)
    else:
        started = volume_services.start_uploads(volume=volume, files=announced)
    ids = [answer["upload_id"] for answer in started if not answer.get("skipped")]
    uploads = {u.public_id: u for u in Upload.objects.filter(volume=volume, public_id__in=ids)}
    objects: dict[str, bytes] = {}  # a pack's files one after another, in the order announced
    for answer, data in zip(started, files.values(), strict=True):
        if not answer.get("skipped"):
            key = uploads[answer["upload_id"]].object_key
            objects[key] = objects.get(key, b"") + data
    for key, data in objects.items():
        get_store().put_bytes(key, data)
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
