"""What the benchmarks share: ports, waiting for a server, timing, a moto S3 server."""

import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
    """A moto S3 server on a free loopback port; the caller terminates it."""
    port = free_port()
    process = subprocess.Popen(
        [str(BIN / "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    wait_for(f"{url}/moto-api/")
    return process, url
