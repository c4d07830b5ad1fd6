"""The control plane under load, in the production topology (scripts/prod_like.py: gunicorn on
PostgreSQL, Redis, an S3 store): 10 workspaces submitting 200 training jobs and starting 2,000
uploads at once, from 32 client threads. The baseline, in the same run under the same load, is
`GET /healthz`, the cheapest request through the same stack (it asks the database, the broker
and the store).

    scripts/with-services.sh .venv/bin/python -m bench.control_plane [--workspaces 10]
        [--jobs 200] [--uploads 2000] [--threads 32] [--web-workers 4]

Prints per request kind: how many, per second, p50/p99 latency, database queries per request
(first and last tenth: a count that grew with the workspace's jobs or files would show), and the
ratio of each p50 to the baseline's. No task cluster runs: submitted jobs stay queued, so the
figures are the API's alone.
"""

import argparse
import json
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from bench.common import new_workspace
from scripts.prod_like import on_services
from veri_sdk import Client

ROWS = [
    {"text": f"What is {a} plus {b}? The answer is {a + b}."} for a in range(6) for b in range(6)
]


def prepare(url: str, key: str, folder: Path) -> tuple[str, str]:
    """A workspace's volume with a model folder in it, and a dataset: what a submit names."""
    veri = Client(api_key=key, base_url=url)
    veri.volumes.create("models")
    veri.volumes.upload_dir("models", folder / "tiny", prefix="tiny")
    return "volume://models/tiny", veri.datasets.upload(folder / "train.jsonl").id


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workspaces", type=int, default=10)
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--uploads", type=int, default=2000)
    parser.add_argument("--threads", type=int, default=32)
    parser.add_argument("--web-workers", type=int, default=4)
    args = parser.parse_args()
    topology = on_services(
        run_dir=Path(tempfile.mkdtemp(prefix="veri-bench-")),
        web_workers=args.web_workers,
        env={"VERI_QUERY_COUNT_HEADER": "1"},
    )
    topology.migrate()
    keys = [
        new_workspace(topology.env, f"bench-{n}", "--credit", "10000", migrate=False)
        for n in range(args.workspaces)
    ]
    topology.start(clusters=0)
    try:
        run(topology.url, keys, args)
    finally:
        topology.stop()


def run(url: str, keys: list[str], args) -> None:
    folder = Path(tempfile.mkdtemp(prefix="veri-bench-data-"))
    (folder / "tiny").mkdir()
    (folder / "tiny" / "config.json").write_text("{}")
    (folder / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    specs = [prepare(url, key, folder) for key in keys]
    work = []  # (kind, workspace index, payload)
    for n in range(max(args.jobs, args.uploads)):
        w = n % len(keys)
        if n < args.jobs:
            work.append(("submit", w, n))
        if n < args.uploads:
            work.append(("upload start", w, n))
        if n % 10 == 0:
            work.append(("baseline", w, n))
    clients = [
        httpx.Client(base_url=url, headers={"Authorization": f"Bearer {k}"}, timeout=120)
        for k in keys
    ]

    def one(item):
        kind, w, n = item
        base_model, dataset_id = specs[w]
        started = time.perf_counter()
        if kind == "submit":
            answer = clients[w].post(
                "/v1/training_jobs",
                json={
                    "base_model": base_model,
                    "dataset_id": dataset_id,
                    "method": "sft_text",
                    "gpu_type": "cpu",
                },
            )
            ok = answer.status_code == 201
        elif kind == "upload start":
            answer = clients[w].post(
                "/v1/volumes/models/files", json={"path": f"data/part-{n:05d}.bin", "size": 1024}
            )
            ok = answer.status_code == 201
        else:
            answer = httpx.get(f"{url}/healthz")
            ok = answer.status_code == 200
        elapsed = time.perf_counter() - started
        if not ok:
            raise SystemExit(f"{kind} answered {answer.status_code}: {answer.text[:300]}")
        return kind, elapsed, int(answer.headers.get("Veri-Db-Queries", 0))

    began = time.perf_counter()
    with ThreadPoolExecutor(args.threads) as pool:
        results = list(pool.map(one, work))
    wall = time.perf_counter() - began

    by_kind: dict[str, list[tuple[float, int]]] = {}
    for kind, elapsed, queries in results:
        by_kind.setdefault(kind, []).append((elapsed, queries))
    baseline_p50 = statistics.median(e for e, _ in by_kind["baseline"])
    print(
        f"{len(keys)} workspaces, {len(work)} requests from {args.threads} threads in {wall:.1f} s "
        f"against gunicorn ({args.web_workers} workers) on PostgreSQL, Redis and S3 (moto)."
    )
    for kind, rows in by_kind.items():
        latencies = sorted(e for e, _ in rows)
        queries = [q for _, q in rows]
        tenth = max(1, len(queries) // 10)
        p50, p99 = statistics.median(latencies), latencies[int(0.99 * (len(latencies) - 1))]
        print(
            f"  {kind:13s} {len(rows):5d}  {len(rows) / wall:7.1f}/s  p50 {p50 * 1000:6.1f} ms  "
            f"p99 {p99 * 1000:6.1f} ms  queries first tenth {min(queries[:tenth])}-"
            f"{max(queries[:tenth])}, last tenth {min(queries[-tenth:])}-{max(queries[-tenth:])}"
            f"  p50/baseline {p50 / baseline_p50:.2f}"
        )


if __name__ == "__main__":
    main()
