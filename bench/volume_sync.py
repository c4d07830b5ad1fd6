"""The worker's volume sync (verification included) against `aws s3 sync`, `s5cmd sync` and a
ceiling (16 threads doing plain boto3 GETs), all from one moto S3 server started here, in one run.

    .venv/bin/python -m bench.volume_sync [--small 1000] [--large 2] [--large-mib 256] [--repeat 3]
        [--rtt-ms 20]

Each tool runs --repeat times into an empty folder, the tools taking turns, and its best time
counts (one loaded 2-core machine varies by a third from run to run). Prints each time and
ratios (baseline time / Veri time: above 1 means Veri is faster). Small files are also synced
as `veri volumes upload-dir` stores them, in packs (one ranged GET for many files), a row of its
own: the baselines read one object per file. moto is a single-process server: at 0 ms its
request rate is the limit for every tool. With --rtt-ms every request to the store crosses a
loopback proxy adding that round trip (bench.rtt_proxy).
"""

import argparse
import hashlib
import os
import shutil
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench.common import BIN, s3_client, start_moto, timed
from bench.rtt_proxy import proxied
from worker.volumes import PART_SIZE, SPLIT_ABOVE, sync_volume

BUCKET = "bench"
PACK_FILES = 200  # upload-dir's batch: one pack each for files this small


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--small", type=int, default=1000)
    parser.add_argument("--large", type=int, default=2)
    parser.add_argument("--large-mib", type=int, default=256)
    parser.add_argument("--repeat", type=int, default=3, help="best of this many runs of each")
    parser.add_argument(
        "--rtt-ms", type=float, default=0, help="round trip added to every request (0: none)"
    )
    args = parser.parse_args()
    env = {
        **os.environ,
        "AWS_ACCESS_KEY_ID": "bench",
        "AWS_SECRET_ACCESS_KEY": "bench",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    moto, direct = start_moto()
    work = Path(tempfile.mkdtemp(prefix="veri-sync-bench-"))
    try:
        with proxied(direct, args.rtt_ms) as url:
            measure(args, env, direct, url, work)
    finally:
        moto.terminate()
        moto.wait()
        shutil.rmtree(work, ignore_errors=True)


def measure(args, env: dict, direct: str, url: str, work: Path) -> None:
    """Fill the store through `direct`, then time each tool reading it through `url`."""
    print(
        f"round trip to the store: {args.rtt_ms:g} ms"
        + ("" if args.rtt_ms else " (one moto process is the limit for every tool)")
    )
    filler, s3 = s3_client(direct), s3_client(url)
    filler.create_bucket(Bucket=BUCKET)
    sets = [
        ("small", f"{args.small} x 4 KiB", args.small, 4096),
        ("large", f"{args.large} x {args.large_mib} MiB", args.large, args.large_mib * 1024**2),
    ]
    credentials = {
        "kind": "s3",
        "access_key_id": "bench",
        "secret_access_key": "bench",
        "session_token": "bench",
        "expiration": "2099-01-01T00:00:00+00:00",
        "bucket": BUCKET,
        "endpoint_url": url,
        "region": "us-east-1",
    }
    for name, label, count, size in sets:
        files, packed, pack = [], [], b""
        for i in range(count):
            data = os.urandom(size)
            key = f"vol/{name}/f{i:05d}.bin"
            filler.put_object(Bucket=BUCKET, Key=key, Body=data)
            file = {
                "path": f"f{i:05d}.bin",
                "size": size,
                "key": key,
                "sha256": hashlib.sha256(data).hexdigest(),
            }
            files.append(file)
            if name == "small":  # also in packs, as upload-dir stores them
                pack_key = f"vol/packs/{name}/{i // PACK_FILES}"
                packed.append(file | {"key": pack_key, "object_key": pack_key, "offset": len(pack)})
                pack += data
                if len(packed) % PACK_FILES == 0 or i == count - 1:
                    filler.put_object(Bucket=BUCKET, Key=pack_key, Body=pack)
                    pack = b""
            del data
        volume = {
            "name": name,
            "file_count": count,
            "total_bytes": count * size,
            "files": files,
            "credentials": credentials,
        }
        runs = {
            "veri sync (+verify)": lambda v=volume, n=name: sync_volume(
                None, v, work / "veri" / n, lambda _: None
            ),
            "aws s3 sync": lambda n=name: subprocess.run(
                [
                    str(BIN / "aws"),
                    "s3",
                    "sync",
                    "--quiet",
                    f"s3://{BUCKET}/vol/{n}",
                    str(work / "aws" / n),
                    "--endpoint-url",
                    url,
                ],
                env=env,
                check=True,
            ),
            "s5cmd sync": lambda n=name: subprocess.run(
                [
                    str(BIN / "s5cmd"),
                    "--endpoint-url",
                    url,
                    "sync",
                    f"s3://{BUCKET}/vol/{n}/*",
                    f"{work / 's5cmd' / n}/",
                ],
                env=env,
                check=True,
                capture_output=True,
            ),
            "ceiling (16 GET threads)": lambda f=files, n=name: ceiling(
                s3, f, work / "ceiling" / n
            ),
            # Every large file in PART_SIZE ranges from the start, as the sync did before it
            # judged its connections: moto reads the whole object again for each range.
            "ranged GETs, no checks": lambda f=files, n=name: ceiling(
                s3, f, work / "ranged" / n, part_size=PART_SIZE, ranged_above=SPLIT_ABOVE
            ),
        }
        if packed:
            in_packs = volume | {"files": packed}
            runs["veri sync, packed"] = lambda v=in_packs, n=name: sync_volume(
                None, v, work / "packed" / n, lambda _: None
            )
        times = {}
        # Best of --repeat, each into an empty folder (a sync skips what is there); the tools
        # take turns, so each sees the server as it is after the same number of runs.
        for _ in range(args.repeat):
            for label_, run in runs.items():
                shutil.rmtree(work, ignore_errors=True)
                seconds = timed(run)
                times[label_] = min(times.get(label_, seconds), seconds)
        total = count * size / 1024**2
        print(f"\n{label} ({total:.1f} MiB)")
        for label_, seconds in times.items():
            print(f"  {label_:26s} {seconds:7.2f} s  {total / seconds:8.1f} MiB/s")
        veri = times["veri sync (+verify)"]
        print(f"  ratio vs aws s3 sync : {times['aws s3 sync'] / veri:.2f}x (>1: veri faster)")
        print(f"  ratio vs s5cmd sync  : {times['s5cmd sync'] / veri:.2f}x")
        print(f"  share of ceiling     : {times['ceiling (16 GET threads)'] / veri:.2f}")
        print(f"  vs ranged GETs       : {times['ranged GETs, no checks'] / veri:.2f}x")
        if packed:
            in_packs = times["veri sync, packed"]
            print(
                f"  packed, as upload-dir stores them: {times['s5cmd sync'] / in_packs:.2f}x "
                f"s5cmd, {times['ceiling (16 GET threads)'] / in_packs:.2f} of ceiling"
            )


def ceiling(
    s3, files: list[dict], dest: Path, *, part_size: int = 0, ranged_above: int | None = None
) -> None:
    """16 threads of plain GETs, each object whole, or (`ranged_above`) in `part_size` ranges."""
    dest.mkdir(parents=True, exist_ok=True)

    def get(item: tuple[dict, int | None]) -> None:
        file, start = item
        if start is None:
            body = s3.get_object(Bucket=BUCKET, Key=file["key"])["Body"].read()
            (dest / file["path"]).write_bytes(body)
            return
        end = min(start + part_size, file["size"]) - 1
        body = s3.get_object(Bucket=BUCKET, Key=file["key"], Range=f"bytes={start}-{end}")
        with (dest / file["path"]).open("r+b") as out:
            out.seek(start)
            out.write(body["Body"].read())

    work = []
    for file in files:
        if ranged_above is not None and file["size"] > ranged_above:
            with (dest / file["path"]).open("wb") as out:
                out.truncate(file["size"])
            work += [(file, start) for start in range(0, file["size"], part_size)]
        else:
            work.append((file, None))
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(get, work))


if __name__ == "__main__":
    main()
