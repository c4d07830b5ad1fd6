"""Mount volumes: each is synced to `<mount root>/<name>` with short-lived read credentials (scoped
STS credentials on S3 with a role; else a signed URL per file: the local store, an S3 store without
STS), many files at once, a large file split in ranged parts when one connection alone would be
slow, then checked against what the control plane recorded."""

import contextlib
import hashlib
import os
import shutil
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor, wait
from datetime import UTC, datetime
from pathlib import Path

import httpx

from worker.client import ControlPlane
from worker.errors import JobFailure

PART_SIZE = 64 * 1024**2
CHUNK = 1024 * 1024
SPLIT_ABOVE = 128 * 1024**2  # a smaller file always comes in one GET
# A large file starts as one GET. After PROBE_SECONDS, if the rest would take more than
# SPLIT_WORTH_SECONDS at that connection's rate, a second connection fetches the file's last part;
# only if the two together run SPLIT_GAIN times as fast as the first did alone is the rest split
# into ranged GETs. More connections pay where one connection is the limit (S3 gives each about
# 100 MB/s); where the store or the link is the limit they only add work (moto, for one, reads
# the whole object again for every range).
PROBE_SECONDS = 0.5
SPLIT_WORTH_SECONDS = 1.0
SPLIT_GAIN = 1.5
PARALLEL = 16
REFRESH_MARGIN_SECONDS = 300
DISK_SHARE = 0.8


class Fetcher:
    """Reads objects of one volume; renews its credentials when they are about to expire."""

    def __init__(self, api: ControlPlane, volume: dict):
        self.api, self.name, self.lock = api, volume["name"], threading.Lock()
        self._use(volume)
        self.http = httpx.Client(timeout=300, limits=httpx.Limits(max_connections=PARALLEL * 2))

    def _use(self, volume: dict) -> None:
        self.credentials = volume["credentials"]
        self.urls = {f["path"]: f.get("url") for f in volume["files"]}
        self.s3 = None
        if self.credentials["kind"] == "s3":
            import boto3
            from botocore.config import Config

            c = self.credentials
            self.s3 = boto3.client(
                "s3",
                endpoint_url=c["endpoint_url"],
                region_name=c["region"],
                aws_access_key_id=c["access_key_id"],
                aws_secret_access_key=c["secret_access_key"],
                aws_session_token=c["session_token"],
                config=Config(max_pool_connections=PARALLEL * 2, retries={"max_attempts": 5}),
            )
        # Both kinds expire (credentials, or presigned URLs signed for as long): renewed alike.
        expiration = self.credentials.get("expiration")
        self.expires = datetime.fromisoformat(expiration) if expiration else None

    def _fresh(self) -> None:
        if self.expires is None:
            return
        with self.lock:
            if (self.expires - datetime.now(UTC)).total_seconds() > REFRESH_MARGIN_SECONDS:
                return
            answer = self.api.call("POST", "/volume-credentials")
            self._use(next(v for v in answer["volumes"] if v["name"] == self.name))

    @contextlib.contextmanager
    def chunks(
        self, file: dict, start: int | None = None, end: int | None = None
    ) -> Iterator[Iterator[bytes]]:
        """The file's bytes (or bytes start..end of it) a chunk at a time, so memory stays flat
        however large the file, with 16 downloads at once; leaving early drops the connection.
        A file of a pack (`offset`) is its range of the pack's object."""
        self._fresh()
        if (base := file.get("offset")) is not None:
            start, end = base + (start or 0), base + (file["size"] - 1 if end is None else end)
        byte_range = f"bytes={start}-{end}" if start is not None else None
        if self.s3 is not None:
            kwargs = {"Range": byte_range} if byte_range else {}
            body = self.s3.get_object(Bucket=self.credentials["bucket"], Key=file["key"], **kwargs)
            try:
                yield body["Body"].iter_chunks(CHUNK)
            finally:
                body["Body"].close()
            return
        headers = {"Range": byte_range} if byte_range else {}
        with self.http.stream("GET", self.urls[file["path"]], headers=headers) as response:
            response.raise_for_status()
            yield response.iter_bytes(CHUNK)

    def copy(self, file: dict, out, start: int | None = None, end: int | None = None) -> None:
        with self.chunks(file, start, end) as chunks:
            for chunk in chunks:
                out.write(chunk)


class _Hashing:
    """Writes through to `out`, hashing the bytes in the order they pass."""

    def __init__(self, out):
        self.out, self.digest = out, hashlib.sha256()

    def write(self, chunk: bytes) -> None:
        self.digest.update(chunk)
        self.out.write(chunk)


def _download(fetcher: Fetcher, file: dict, target: Path, pool: ThreadPoolExecutor | None) -> str:
    """Fetch the file and return its sha256, computed while it arrives rather than by reading it
    again afterwards. A large one may be split (see PROBE_SECONDS) into ranged parts on `pool`."""
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.partial")
    if file["size"] > SPLIT_ABOVE and pool is not None:
        sha256 = _download_splitting(fetcher, file, partial, pool)
    else:
        with partial.open("wb") as out:
            hashing = _Hashing(out)
            fetcher.copy(file, hashing)
        sha256 = hashing.digest.hexdigest()
    os.replace(partial, target)
    return sha256


def _download_pack(
    fetcher: Fetcher, members: list[dict], dest: Path, arrived: dict[str, str]
) -> None:
    """Files of one pack in one ranged GET of the span they cover, each written to its target as
    its bytes pass (the bytes of files not asked for are skipped); each file's sha256 goes in
    `arrived` as it lands."""
    members = sorted(members, key=lambda f: f["offset"])
    first = members[0]["offset"]
    span = dict(members[0], offset=first, size=members[-1]["offset"] + members[-1]["size"] - first)
    position, waiting = first, iter(members)
    file, out = next(waiting), None
    try:
        with fetcher.chunks(span) as chunks:
            for chunk in chunks:
                view = memoryview(chunk)
                while view and file:
                    if position < file["offset"]:  # a file not asked for
                        skip = min(file["offset"] - position, len(view))
                        view, position = view[skip:], position + skip
                        continue
                    if out is None:
                        target = dest / file["path"]
                        target.parent.mkdir(parents=True, exist_ok=True)
                        partial = target.with_name(f".{target.name}.partial")
                        out = _Hashing(partial.open("wb"))
                    take = min(file["offset"] + file["size"] - position, len(view))
                    out.write(view[:take])
                    view, position = view[take:], position + take
                    if position == file["offset"] + file["size"]:
                        out.out.close()
                        os.replace(partial, target)
                        arrived[file["path"]] = out.digest.hexdigest()
                        file, out = next(waiting, None), None
    finally:
        if out is not None:
            out.out.close()


def _download_splitting(
    fetcher: Fetcher, file: dict, partial: Path, pool: ThreadPoolExecutor
) -> str:
    """One GET of the whole file, hashed as it arrives; a second connection, then ranged parts, as
    the comment at PROBE_SECONDS says. Once parts after it are fetched, this GET stops where they
    begin, and each part is hashed, in order, as soon as it and those before it are on disk."""
    size = file["size"]
    last = (size - 1) // PART_SIZE * PART_SIZE  # where the file's last part starts
    parts: list[tuple[int, Future]] = []  # the parts after `stop`, in file order
    launched: list[Future] = []

    def fetch_part(start: int) -> Future:
        def part() -> None:
            with partial.open("r+b") as out:  # each part writes through its own handle
                out.seek(start)
                fetcher.copy(file, out, start, min(start + PART_SIZE, size) - 1)

        launched.append(pool.submit(part))
        return launched[-1]

    try:
        with partial.open("wb") as out:
            out.truncate(size)
            hashing = _Hashing(out)
            stop, got, judged = size, 0, False
            # This connection's rate counts from its first bytes: a store that reads the whole
            # object before answering would otherwise look slow on one connection.
            first_at = first_got = None
            probe = None  # the second connection: its future, when it started, `got` then
            with fetcher.chunks(file) as chunks:
                for chunk in chunks:
                    chunk = chunk[: stop - got]
                    hashing.write(chunk)
                    got += len(chunk)
                    if got >= stop:
                        break
                    now = time.monotonic()
                    if first_at is None:
                        first_at, first_got = now, got
                    elif not judged and now - first_at >= PROBE_SECONDS:
                        judged = True
                        alone = (got - first_got) / max(now - first_at, 1e-6)  # bytes/s, one GET
                        if size - got > alone * SPLIT_WORTH_SECONDS and last > got:
                            probe = (fetch_part(last), now, got)
                    elif probe and probe[0].done():
                        future, since, got_then = probe
                        probe = None
                        # This GET fetches the part itself if it got there first or the
                        # probe failed (writing the same bytes over whatever it left).
                        if got >= last or future.exception():
                            continue
                        together = (got - got_then + size - last) / max(now - since, 1e-6)
                        stop, parts = last, [(last, future)]
                        if together >= SPLIT_GAIN * alone:
                            stop = min(last, (got // PART_SIZE + 1) * PART_SIZE)
                            middle = range(stop, last, PART_SIZE)
                            parts = [(s, fetch_part(s)) for s in middle] + parts
        with partial.open("rb") as written:
            for start, done in parts:
                done.result()
                written.seek(start)
                left = min(PART_SIZE, size - start)
                while left and (chunk := written.read(min(CHUNK * 8, left))):
                    hashing.digest.update(chunk)
                    left -= len(chunk)
    finally:
        # Nothing may still write into the file once this returns or raises.
        for future in launched:
            future.cancel()
        wait(launched)
    return hashing.digest.hexdigest()


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1024 * 1024):
            digest.update(chunk)
    return digest.hexdigest()


def _present(target: Path, size: int) -> bool:
    """Already there from an earlier run on this machine (its sha256 is checked after the sync)."""
    return target.is_file() and target.stat().st_size == size


def check_disk(volumes: list[dict], root: Path, free_override: int | None = None) -> None:
    need = sum(v["total_bytes"] for v in volumes)
    free = free_override if free_override is not None else shutil.disk_usage(root).free
    if need > DISK_SHARE * free:
        raise JobFailure(
            "volume_too_large_for_node",
            f"the volumes need {need} bytes, more than 80% of this node's {free} free bytes; "
            "pick a GPU type with more disk, or mount less",
        )


def sync_volume(api: ControlPlane, volume: dict, root: Path, say) -> Path:
    """Sync one volume under `root/<name>`; raises volume_sync_incomplete naming what is missing."""
    dest = root / volume["name"]
    dest.mkdir(parents=True, exist_ok=True)
    fetcher = Fetcher(api, volume)
    problems: dict[str, str] = {}
    started = time.monotonic()
    small = [f for f in volume["files"] if f["size"] <= SPLIT_ABOVE]
    large = [f for f in volume["files"] if f["size"] > SPLIT_ABOVE]

    arrived: dict[str, str] = {}  # path → sha256 of the bytes as they arrived

    def fetch(file: dict, pool: ThreadPoolExecutor | None = None) -> None:
        target = dest / file["path"]
        try:
            if not _present(target, file["size"]):
                arrived[file["path"]] = _download(fetcher, file, target, pool)
        except Exception as exc:  # noqa: BLE001 - every failure is named in the report
            problems[file["path"]] = f"{type(exc).__name__}: {exc}"[:300]

    def fetch_pack(members: list[dict]) -> None:
        wanted = [f for f in members if not _present(dest / f["path"], f["size"])]
        try:
            if wanted:
                _download_pack(fetcher, wanted, dest, arrived)
        except Exception as exc:  # noqa: BLE001 - every failure is named in the report
            for file in wanted:
                if file["path"] not in arrived:
                    problems[file["path"]] = f"{type(exc).__name__}: {exc}"[:300]

    packs: dict[str, list[dict]] = {}  # the files of each pack, fetched together
    for file in small:
        if "offset" in file:
            packs.setdefault(file["object_key"], []).append(file)
    with ThreadPoolExecutor(PARALLEL) as pool:
        wait(
            [pool.submit(fetch, f) for f in small if "offset" not in f]
            + [pool.submit(fetch_pack, members) for members in packs.values()]
        )
        # Large files side by side, each split (when worth it) in ranged parts on the same pool.
        with ThreadPoolExecutor(max(1, min(len(large), 4))) as files_pool:
            list(files_pool.map(lambda file: fetch(file, pool), large))

        def verify(file: dict) -> None:
            target = dest / file["path"]
            if file["path"] in problems:
                return
            if not target.is_file():
                problems[file["path"]] = "missing after sync"
            elif target.stat().st_size != file["size"]:
                problems[file["path"]] = f"{target.stat().st_size} bytes, expected {file['size']}"
            elif file.get("sha256") and file["sha256"] != (
                arrived.get(file["path"]) or sha256_file(target)  # one already here: read it
            ):
                problems[file["path"]] = "sha256 differs from the uploaded file's"

        list(pool.map(verify, volume["files"]))
    on_disk = [p for p in dest.rglob("*") if p.is_file() and not p.name.endswith(".partial")]
    count, total = len(on_disk), sum(p.stat().st_size for p in on_disk)
    if problems or count < volume["file_count"] or total < volume["total_bytes"]:
        listed = "; ".join(f"{path} ({why})" for path, why in sorted(problems.items())[:20])
        raise JobFailure(
            "volume_sync_incomplete",
            f"volume {volume['name']}: {count} of {volume['file_count']} files, {total} of "
            f"{volume['total_bytes']} bytes arrived; missing or wrong: {listed or 'unknown'}",
        )
    say(
        f"[veri] mounted {volume['name']} at {dest}: {count} files, {total} bytes in "
        f"{time.monotonic() - started:.1f}s"
    )
    return dest


def mount_volumes(api: ControlPlane, root: Path, say, free_override: int | None = None) -> dict:
    answer = api.call("POST", "/volume-credentials")
    volumes = answer["volumes"]
    if not volumes:
        return {}
    root.mkdir(parents=True, exist_ok=True)
    check_disk(volumes, root, free_override)
    mounts = {v["name"]: sync_volume(api, v, root, say) for v in volumes}
    # A job may name a volume by its id too (volume://vol_…/…).
    return mounts | {v["id"]: mounts[v["name"]] for v in volumes}
