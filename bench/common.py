"""What the benchmarks share: ports, waiting for a server, timing, a moto S3 server."""

import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path

import boto3
import httpx
from botocore.config import Config

from scripts.prod_like import free_port  # noqa: F401 - the benchmarks' one way to get a port

BIN = Path(sys.executable).parent
REPO = Path(__file__).resolve().parent.parent
MANAGE = [sys.executable, str(REPO / "manage.py")]


def wait_for(url: str, seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            httpx.get(url, timeout=1)
            return
        except httpx.TransportError:
            time.sleep(0.1)
    raise SystemExit(f"{url} did not come up")


def timed(run) -> float:
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def start_moto() -> tuple[subprocess.Popen, str]:
    """A moto S3 server on a free loopback port; the caller terminates it.

    moto spills every object over 5 MiB to a temporary file. On this machine's disk, writing
    4 x 64 MiB cost moto from 0.6 to 3.1 s of kernel time from one run to the next (page cache
    writeback), whichever tool sent them: in memory (/dev/shm) it is 0.6-0.7 s every run."""
    port = free_port()
    shm = Path("/dev/shm")
    process = subprocess.Popen(
        [str(BIN / "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "TMPDIR": str(shm)} if shm.is_dir() else None,
    )
    url = f"http://127.0.0.1:{port}"
    wait_for(f"{url}/moto-api/")
    return process, url


def s3_client(endpoint_url: str):
    return boto3.client(
        "s3",
        endpoint_url=endpoint_url,
        region_name="us-east-1",
        aws_access_key_id="bench",
        aws_secret_access_key="bench",
        config=Config(signature_version="s3v4", max_pool_connections=32),
    )


def new_workspace(env: dict, name: str = "bench", *options: str, migrate: bool = True) -> str:
    """Create a workspace (`options`: create_workspace's, e.g. --credit 100) in the database `env`
    names, migrated first unless `migrate` is False; returns its API key."""
    if migrate:
        subprocess.run([*MANAGE, "migrate", "-v0"], env=env, check=True)
    created = subprocess.run(
        [*MANAGE, "create_workspace", name, *options],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    return created.stdout.strip().splitlines()[-1]


def tiny_model(env: dict, folder: Path) -> Path:
    """The tiny causal LM the suite trains (made here: no model hub), in `folder`."""
    subprocess.run(
        [sys.executable, "-m", "worker.tinymodel", str(folder)],
        env=env,
        check=True,
        capture_output=True,
        cwd=REPO,
    )
    return folder


def embedded_env(work: Path, port: int) -> dict:
    """The embedded default (SQLite, local store, local provider) in the folder `work`, served
    at `port`."""
    import os

    return {
        **os.environ,
        "DATABASE_URL": f"sqlite:///{work / 'db.sqlite3'}",
        "VERI_STORE": f"file://{work / 'store'}",
        "VERI_PUBLIC_URL": f"http://127.0.0.1:{port}",
        "VERI_LOCAL_INSTANCES_DIR": str(work / "instances"),
        "HF_HUB_OFFLINE": "1",
        "VERI_WATCH_PERIOD_SECONDS": "2",
    }


@contextlib.contextmanager
def embedded_platform(env: dict, port: int):
    """An API server and a qcluster on `env`, stopped on the way out."""
    processes = [
        subprocess.Popen(
            [*MANAGE, "runserver", f"127.0.0.1:{port}", "--noreload"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        ),
        subprocess.Popen(
            [*MANAGE, "qcluster"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        ),
    ]
    try:
        wait_for(f"http://127.0.0.1:{port}/v1/schema")
        yield
    finally:
        for process in processes:
            process.terminate()
            process.wait()


def steps_per_second(log: str) -> float:
    """From a Veri job's log: its last progress line's mean seconds per step."""
    import re

    found = re.findall(r"^step \d+/\d+ .* ([\d.]+) s/step", log, re.MULTILINE)
    return 1 / float(found[-1])
