"""`manage.py runserver` (the quickstart's, the demo's, the benchmarks' API) and the tests' live
server answer each request on a kept-alive connection at once: with Nagle's algorithm on, each
waited 40 ms for the client's delayed ACK of its headers (config/devserver.py)."""

import statistics
import subprocess
import sys
import time

import httpx

from scripts.prod_like import free_port
from tests.conftest import REPO, wait_for

# Linux's shortest delayed ACK: what each request waited at least, on top of its answer's time
NAGLE_WAIT = 0.04


def kept_alive_median(url: str) -> float:
    """The median seconds of 20 requests on one connection, after its first (which the kernel
    acknowledges at once)."""
    with httpx.Client(base_url=url) as client:
        client.get("/v1/volumes")
        times = []
        for _ in range(20):
            started = time.perf_counter()
            assert client.get("/v1/volumes").status_code == 401  # no key: the API's own answer
            times.append(time.perf_counter() - started)
    return statistics.median(times)


def test_the_live_server_answers_kept_alive_requests_without_waiting(live_server):
    assert kept_alive_median(live_server.url) < NAGLE_WAIT * 0.75


def test_runserver_answers_kept_alive_requests_without_waiting(tmp_path):
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "manage.py", "runserver", f"127.0.0.1:{port}", "--noreload"],
        cwd=REPO,
        env={"PATH": "/usr/bin:/bin", "DATABASE_URL": f"sqlite:///{tmp_path / 'db.sqlite3'}"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: answers(url), timeout=30, what="runserver")
        assert kept_alive_median(url) < NAGLE_WAIT * 0.75
    finally:
        server.terminate()
        server.wait()


def answers(url: str) -> bool:
    try:
        return httpx.get(f"{url}/v1/volumes").status_code == 401
    except httpx.TransportError:
        return False
