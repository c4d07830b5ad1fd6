"""The production topology on one machine: Redis as the task broker, gunicorn with several web
workers, two or more `qcluster` processes sharing the Redis queue, on the PostgreSQL database and
S3 store it is given. `make serve-prod-like` runs it for people; the topology tests drive it
(restarting or killing pieces) through `Topology`.

    scripts/with-services.sh .venv/bin/python scripts/prod_like.py [--web-workers 3] [--clusters 2]

needs DATABASE_URL (PostgreSQL) and VERI_TEST_S3_URL (an S3 API server), which
scripts/with-services.sh provides, and Debian's redis-server.
"""

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import boto3
import httpx

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stop(process: subprocess.Popen | None, *, kill: bool = False, wait: float = 20) -> None:
    """SIGTERM to the process, which stops its own children (a qcluster signalled together with
    its workers stalls); SIGKILL to its whole session when asked, or when it outstays `wait`."""
    if process is None or process.poll() is not None:
        return
    try:
        if kill:
            os.killpg(process.pid, signal.SIGKILL)
        else:
            process.terminate()
        process.wait(timeout=wait)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    except ProcessLookupError:
        pass


class Topology:
    """Redis, gunicorn and qclusters over a given database and S3 store; each piece can be
    stopped, killed and started again. Logs go to `run_dir` (redis.log, web.log, cluster-N.log)."""

    def __init__(
        self,
        *,
        database_url: str,
        store_url: str,
        s3_endpoint: str,
        run_dir: Path,
        web_workers: int = 3,
        env: dict | None = None,
        web_env: dict | None = None,
    ):
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.web_workers = web_workers
        self.web_env = web_env or {}  # on top of `env`, for gunicorn alone
        self.redis_port, self.web_port = free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.web_port}"
        self.redis: subprocess.Popen | None = None
        self.web: subprocess.Popen | None = None
        self.clusters: list[subprocess.Popen] = []
        self.env = {
            **os.environ,
            "DATABASE_URL": database_url,
            "VERI_STORE": store_url,
            "AWS_ENDPOINT_URL": s3_endpoint,
            "AWS_ACCESS_KEY_ID": os.environ.get("AWS_ACCESS_KEY_ID", "testing"),
            "AWS_SECRET_ACCESS_KEY": os.environ.get("AWS_SECRET_ACCESS_KEY", "testing"),
            # Workers get STS credentials scoped to each volume (moto's STS takes any role).
            "VERI_STS_ROLE_ARN": os.environ.get(
                "VERI_STS_ROLE_ARN", "arn:aws:iam::123456789012:role/veri-worker-storage"
            ),
            "VERI_REDIS_URL": f"redis://127.0.0.1:{self.redis_port}/0",
            "VERI_PUBLIC_URL": self.url,
            "VERI_DB_CONN_MAX_AGE": "60",
            "VERI_LOCAL_INSTANCES_DIR": str(self.run_dir / "instances"),
            "VERI_LOCAL_SLOTS": "4",
            "VERI_Q_WORKERS": "3",
            "HF_HUB_OFFLINE": "1",
            **(env or {}),
        }

    def _spawn(
        self, command: list[str], log_name: str, env: dict | None = None
    ) -> subprocess.Popen:
        log = open(self.run_dir / log_name, "ab")  # noqa: SIM115 - the child holds it open
        return subprocess.Popen(
            command,
            cwd=REPO,
            env={**self.env, **(env or {})},
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # each piece in its own session, so it can be killed alone
        )

    # Redis: its append-only file is fsynced on every write, so a killed Redis loses no task.
    def start_redis(self) -> None:
        server = shutil.which("redis-server") or "/usr/bin/redis-server"
        self.redis = self._spawn(
            [
                server,
                "--port", str(self.redis_port),
                "--bind", "127.0.0.1",
                "--dir", str(self.run_dir),
                "--appendonly", "yes",
                "--appendfsync", "always",
                "--save", "",
                "--protected-mode", "no",
            ],
            "redis.log",
        )  # fmt: skip
        deadline = time.monotonic() + 20
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.redis_port), timeout=1) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith(b"+PONG"):
                        return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"redis-server did not start; see {self.run_dir}/redis.log")
            time.sleep(0.1)

    def stop_redis(self, *, kill: bool = False) -> None:
        _stop(self.redis, kill=kill)

    def start_web(self) -> None:
        self.web = self._spawn(
            [
                str(BIN / "gunicorn"),
                "config.wsgi:application",
                "--bind", f"127.0.0.1:{self.web_port}",
                "--workers", str(self.web_workers),
                "--timeout", "120",
                "--graceful-timeout", "20",
                "--no-control-socket",
                "--preload",  # the app imported once, then forked: each worker starts at once
            ],
            "web.log",
            self.web_env,
        )  # fmt: skip
        self.wait_healthy()

    def stop_web(self, *, kill: bool = False) -> None:
        _stop(self.web, kill=kill)

    def start_cluster(self) -> subprocess.Popen:
        process = self._spawn(
            [sys.executable, "manage.py", "qcluster"], f"cluster-{len(self.clusters)}.log"
        )
        self.clusters.append(process)
        return process

    def stop_cluster(self, process: subprocess.Popen, *, kill: bool = False) -> None:
        _stop(process, kill=kill)

    def wait_healthy(self, timeout: float = 60) -> dict:
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            try:
                answer = httpx.get(f"{self.url}/healthz", timeout=5)
                last = answer.json()
                if answer.status_code == 200:
                    return last
            except (httpx.HTTPError, ValueError):
                pass
            time.sleep(0.2)
        raise RuntimeError(f"{self.url}/healthz never answered 200 (last: {last})")

    def migrate(self) -> None:
        subprocess.run(
            [sys.executable, "manage.py", "migrate", "--no-input", "-v", "0"],
            cwd=REPO,
            env=self.env,
            check=True,
        )

    def start(self, *, clusters: int = 2) -> "Topology":
        self.start_redis()
        self.start_web()
        for _ in range(clusters):
            self.start_cluster()
        return self

    def stop(self) -> None:
        # All at once: each waits for its own work in progress, which need not add up.
        with ThreadPoolExecutor() as pool:
            list(pool.map(_stop, [*self.clusters, self.web]))
        self.stop_redis()


def on_services(*, run_dir: Path, web_workers: int, env: dict | None = None) -> Topology:
    """A topology on the PostgreSQL database and S3 server that scripts/with-services.sh started,
    in a new bucket (what `make serve-prod-like` and bench/control_plane.py run)."""
    database_url, s3 = os.environ.get("DATABASE_URL"), os.environ.get("VERI_TEST_S3_URL")
    if not (database_url or "").startswith("postgres") or not s3:
        sys.exit("Run it under scripts/with-services.sh (PostgreSQL and an S3 server).")
    bucket = f"veri-{uuid.uuid4().hex[:8]}"
    boto3.client(
        "s3",
        endpoint_url=s3,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    ).create_bucket(Bucket=bucket)
    return Topology(
        database_url=database_url,
        store_url=f"s3://{bucket}",
        s3_endpoint=s3,
        run_dir=run_dir,
        web_workers=web_workers,
        env=env,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--web-workers", type=int, default=3)
    parser.add_argument("--clusters", type=int, default=2)
    args = parser.parse_args()
    run_dir = REPO / ".veri" / "prod-like"
    shutil.rmtree(run_dir, ignore_errors=True)  # a fresh database: no tasks queued for an old one
    topology = on_services(run_dir=run_dir, web_workers=args.web_workers)
    topology.migrate()
    made = subprocess.run(
        [sys.executable, "manage.py", "create_workspace", "prod-like", "--credit", "100"],
        cwd=REPO,
        env=topology.env,
        check=True,
        capture_output=True,
        text=True,
    )
    topology.start(clusters=args.clusters)
    health = topology.wait_healthy()
    print(
        f"Veri, production-like: gunicorn ({args.web_workers} workers) at {topology.url}, "
        f"{args.clusters} qclusters on Redis :{topology.redis_port}, PostgreSQL, S3 "
        f"({topology.env['VERI_STORE']} at {topology.env['AWS_ENDPOINT_URL']}); logs in "
        f"{run_dir}.\n/healthz: {health}\n"
        f"export VERI_API_URL={topology.url} VERI_API_KEY={made.stdout.strip().splitlines()[-1]}\n"
        "Ctrl-C stops it all (the database and the store are thrown away).",
        flush=True,
    )
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        while all(p.poll() is None for p in [topology.web, *topology.clusters]):
            time.sleep(1)
        print("a process of the topology exited; see its log in", run_dir, file=sys.stderr)
    except KeyboardInterrupt:
        pass
    finally:
        topology.stop()


if __name__ == "__main__":
    main()
