import sys
from urllib.parse import urlsplit

import pytest

from billing.services import open_billing_account
from scripts.prod_like import Topology
from tests.conftest import REPO, client_for
from tests.e2e.conftest import database_url
from tests.topology.tcp_fault import TcpFaultProxy
from veri_sdk import Client

STUB_WORKER = f"{sys.executable} {REPO / 'tests/e2e/stub_worker.py'}"


def port_of(url: str) -> int:
    return urlsplit(url).port


@pytest.fixture
def prod_like(transactional_db, settings, s3_store_url, s3_endpoint, tmp_path):
    """Starts the production topology (scripts/prod_like.py) on the test database and a fresh S3
    bucket: Redis, gunicorn (3 workers), qclusters on the Redis broker, the local provider.
    Fault proxies stand in front of the store (`store_proxy`, for everything), of the web server
    as the workers and the launcher reach it (`public_proxy`), and of the database as gunicorn
    reaches it (`db_proxy`)."""
    settings.VERI_STORE = s3_store_url
    started: list[Topology] = []

    def start(*, clusters: int = 2, worker: str = STUB_WORKER, **env) -> Topology:
        store_proxy = TcpFaultProxy(port_of(s3_endpoint))
        db = urlsplit(database_url())
        db_proxy = TcpFaultProxy(db.port)
        topology = Topology(
            database_url=database_url(),
            store_url=s3_store_url,
            s3_endpoint=f"http://127.0.0.1:{store_proxy.port}",
            run_dir=tmp_path / f"topology-{len(started)}",
            env={"VERI_LOCAL_WORKER_COMMAND": worker, "VERI_WATCH_PERIOD_SECONDS": "1", **env},
            web_env={
                "DATABASE_URL": db._replace(
                    netloc=f"{db.netloc.rsplit(':', 1)[0]}:{db_proxy.port}"
                ).geturl()
            },
        )
        public_proxy = TcpFaultProxy(topology.web_port)
        topology.env["VERI_PUBLIC_URL"] = f"http://127.0.0.1:{public_proxy.port}"
        topology.store_proxy, topology.db_proxy = store_proxy, db_proxy
        topology.public_proxy = public_proxy
        started.append(topology)
        topology.start(clusters=clusters)
        return topology

    yield start
    for topology in started:
        topology.stop()


@pytest.fixture
def customer(workspace):
    """An SDK client for the test's workspace, with $100 of credit, once a topology runs."""
    open_billing_account(workspace=workspace, credit_micros=100_000_000)
    raw_key = client_for(workspace).raw_key
    return lambda topology, **options: Client(api_key=raw_key, base_url=topology.url, **options)
