"""`veri volumes upload-dir` against `aws s3 cp --recursive`, `s5cmd cp` and a ceiling (16 threads
doing plain PUTs straight to the store, each with the SHA-256 the store checks, as Veri's:
bench.put_pool), all into one moto S3 server started here, in one run. Each is a process of its
own, timed from its spawn to its exit.

    .venv/bin/python -m bench.upload_dir [--small 1000] [--large 4] [--large-mib 64] [--repeat 3]
        [--rtt-ms 20]

Each tool uploads the set --repeat times, each time to a new volume or prefix, and its best time
counts (one loaded 2-core machine varies by a third from run to run). The tools take turns, each
round in another order, and the bucket is emptied (untimed) after every upload, so each finds the
same store: moto lists by walking every key of a bucket and grows slower as it holds more bytes.
Prints each time and the ratios (baseline time / Veri time: above 1 means Veri is faster).
moto is a single-process server: at 0 ms its request rate is the limit for every tool. With
--rtt-ms every request to the store and to Veri's API crosses a loopback proxy adding that round
trip (bench.rtt_proxy), as against a store in another region. The others send each small file as
its own PUT, which is how they store it; Veri sends them in packs (many files to one PUT, each
file checked against its sha256 when its pack completes), so it makes a few requests where they
make a thousand, and can pass the ceiling, which is per-file PUTs (docs/development.md,
"Benchmarks").
"""

import argparse
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
from functools import partial
from pathlib import Path

from bench.common import (
    BIN,
    MANAGE,
    REPO,
    free_port,
    new_workspace,
    s3_client,
    start_moto,
    timed,
    wait_for,
)
from bench.rtt_proxy import proxied

BUCKET = "bench"


def make_files(root: Path, count: int, size: int) -> Path:
    root.mkdir(parents=True)
    for i in range(count):
        (root / f"f{i:05d}.bin").write_bytes(os.urandom(size))
    return root


def veri_volume(folder: Path, run: int) -> str:
    return f"bench-{folder.name}-{run}"


def run_veri(folder: Path, env: dict, run: int) -> None:
    volume = veri_volume(folder, run)
    veri = [sys.executable, "-m", "veri_sdk", "volumes", "upload-dir", volume, str(folder)]
    subprocess.run(veri, env=env, check=True, capture_output=True)


def run_aws(folder: Path, env: dict, s3_url: str, run: int) -> None:
    subprocess.run(
        [
            str(BIN / "aws"),
            "s3",
            "cp",
            "--recursive",
            "--quiet",
            str(folder),
            f"s3://{BUCKET}/aws-{folder.name}-{run}/",
            "--endpoint-url",
            s3_url,
        ],
        env=env,
        check=True,
    )


def run_s5cmd(folder: Path, env: dict, s3_url: str, run: int) -> None:
    subprocess.run(
        [
            str(BIN / "s5cmd"),
            "--endpoint-url",
            s3_url,
            "cp",
            f"{folder}/*",
            f"s3://{BUCKET}/s5cmd-{folder.name}-{run}/",
        ],
        env=env,
        check=True,
        capture_output=True,
    )


def run_ceiling(folder: Path, env: dict, run: int) -> None:
    prefix = f"ceiling-{folder.name}-{run}/"
    put_pool = [sys.executable, "-m", "bench.put_pool", str(folder), BUCKET, prefix]
    subprocess.run(put_pool, env=env, check=True, cwd=REPO)


def empty(s3) -> None:
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET):
        if keys := [{"Key": obj["Key"]} for obj in page.get("Contents", [])]:
            s3.delete_objects(Bucket=BUCKET, Delete={"Objects": keys, "Quiet": True})


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--small", type=int, default=1000)
    parser.add_argument("--large", type=int, default=4)
    parser.add_argument("--large-mib", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=3, help="best of this many runs of each")
    parser.add_argument(
        "--rtt-ms", type=float, default=0, help="round trip added to every request (0: none)"
    )
    args = parser.parse_args()
    with contextlib.ExitStack() as stack:
        run(args, stack)


def run(args, stack: contextlib.ExitStack) -> None:
    work = Path(tempfile.mkdtemp(prefix="veri-bench-"))
    api_port = free_port()
    moto, direct_s3 = start_moto()
    s3_url = stack.enter_context(proxied(direct_s3, args.rtt_ms))
    api_url = stack.enter_context(proxied(f"http://127.0.0.1:{api_port}", args.rtt_ms))
    env = {
        **os.environ,
        "AWS_ACCESS_KEY_ID": "bench",
        "AWS_SECRET_ACCESS_KEY": "bench",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": s3_url,
        "VERI_STORE": f"s3://{BUCKET}/veri",
        "DATABASE_URL": f"sqlite:///{work / 'db.sqlite3'}",
    }
    processes = [moto]
    try:
        store = s3_client(direct_s3)
        store.create_bucket(Bucket=BUCKET)
        print(
            f"round trip to the store and the API: {args.rtt_ms:g} ms"
            + ("" if args.rtt_ms else " (one moto process is the limit for every tool)")
        )
        key = new_workspace(env)
        processes.append(
            subprocess.Popen(
                [*MANAGE, "runserver", f"127.0.0.1:{api_port}", "--noreload"],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )
        wait_for(f"http://127.0.0.1:{api_port}/v1/schema")
        cli_env = {**env, "VERI_API_URL": api_url, "VERI_API_KEY": key}

        sets = [
            (f"{args.small} x 4 KiB", make_files(work / "small", args.small, 4096)),
            (
                f"{args.large} x {args.large_mib} MiB",
                make_files(work / "large", args.large, args.large_mib * 1024**2),
            ),
        ]
        for label, folder in sets:
            # Like the bucket the other tools write into, each run's volume exists before timing.
            for run in range(args.repeat):
                volume = veri_volume(folder, run)
                create = [sys.executable, "-m", "veri_sdk", "volumes", "create", volume]
                subprocess.run(create, env=cli_env, check=True, capture_output=True)
            runs = {
                "veri upload-dir": partial(run_veri, folder, cli_env),
                "aws s3 cp": partial(run_aws, folder, env, s3_url),
                "s5cmd cp": partial(run_s5cmd, folder, env, s3_url),
                "ceiling (16 PUT threads)": partial(run_ceiling, folder, env),
            }
            times = {}
            names = list(runs)
            for run in range(args.repeat):
                for name in names[run % len(names) :] + names[: run % len(names)]:
                    seconds = timed(partial(runs[name], run))
                    times[name] = min(times.get(name, seconds), seconds)
                    empty(store)
            times = {name: times[name] for name in names}
            total = sum(f.stat().st_size for f in folder.iterdir())
            print(f"\n{label} ({total / 1024**2:.1f} MiB)")
            for name, seconds in times.items():
                print(f"  {name:26s} {seconds:7.2f} s  {total / 1024**2 / seconds:8.1f} MiB/s")
            veri_time = times["veri upload-dir"]
            print(
                f"  ratio vs aws s3 cp  : {times['aws s3 cp'] / veri_time:.2f}x (>1: veri faster)"
            )
            print(f"  ratio vs s5cmd      : {times['s5cmd cp'] / veri_time:.2f}x")
            goal = (
                "goal: >= 0.9, and ahead of s5cmd on small files"
                if args.rtt_ms
                else "at 0 ms the one moto process is every tool's limit"
            )
            print(
                f"  share of ceiling    : {times['ceiling (16 PUT threads)'] / veri_time:.2f}"
                f"  ({goal})"
            )
    finally:
        for process in processes:
            process.terminate()
            process.wait()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
