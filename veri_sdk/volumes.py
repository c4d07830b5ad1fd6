"""`client.volumes`: create, list, delete, and upload files or folders straight to the store."""

from __future__ import annotations

import base64
import hashlib
import os
import threading
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, fields
from itertools import pairwise
from pathlib import Path

from veri_sdk.errors import VeriAPIError
from veri_sdk.http import ApiTransport, StorageTransport

CHUNK = 1024 * 1024
# Files per batch call (the API takes up to 500): smaller batches let the next start and the
# previous completion overlap the transfers.
BATCH = 200
MAX_PARALLEL = 8
SMALL_PARALLEL = 32  # small files: one request each, whose round trip is the limit
FIRST_BATCH = 50
BATCHES_AHEAD = 3  # batches signed and sending at once
# From this size a file goes up on its own (hash, start, send, complete) as soon as it is hashed,
# so hashing one large file overlaps sending another; smaller ones go in batch calls.
LARGE_FILE = 8 * 1024**2
# Hashing is CPU work: one file per core at a time, so the first hashed file starts sending
# while the next ones hash, instead of every file finishing its hash at the same moment.
HASHING = threading.BoundedSemaphore(os.cpu_count() or 2)

OnBytes = Callable[[int], None]


@dataclass
class Volume:
    id: str
    name: str
    region: str
    status: str
    file_count: int
    total_bytes: int
    created_at: str


@dataclass
class VolumeFile:
    path: str
    size: int
    sha256: str
    uploaded_at: str


@dataclass
class UploadDirResult:
    uploaded: list[str]
    skipped: list[str]
    bytes_uploaded: int


class UploadFailed(VeriAPIError):
    """Some files of an upload did not arrive; `failures` maps each path to its reason."""

    def __init__(self, failures: dict[str, str]):
        listed = "; ".join(f"{path}: {why}" for path, why in list(failures.items())[:5])
        more = f" (and {len(failures) - 5} more)" if len(failures) > 5 else ""
        super().__init__(0, "upload_failed", f"{len(failures)} file(s) failed: {listed}{more}")
        self.failures = failures


def _from(cls, data: dict):
    names = {f.name for f in fields(cls)}
    return cls(**{k: v for k, v in data.items() if k in names})


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with HASHING, path.open("rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _reader(segments: list[tuple[Path, int, int]], on_bytes: OnBytes | None):
    """A fresh body for each attempt: each segment (`path, offset, size`: that many bytes from
    there in that file) after the one before (a part of a file, a file, or a pack of files).
    Progress is rewound when an attempt fails part-way."""
    length = sum(segment[2] for segment in segments)

    def body() -> Iterator[bytes]:
        sent = 0
        try:
            for path, offset, size in segments:
                with path.open("rb") as f:
                    f.seek(offset)
                    while size:
                        chunk = f.read(min(CHUNK, size))
                        if not chunk:
                            return
                        sent, size = sent + len(chunk), size - len(chunk)
                        if on_bytes:
                            on_bytes(len(chunk))
                        yield chunk
        except GeneratorExit:
            if on_bytes and sent < length:
                on_bytes(-sent)
            raise

    return body


class Volumes:
    def __init__(self, api: ApiTransport, storage: StorageTransport):
        self.api, self.storage = api, storage

    def create(self, name: str, *, region: str | None = None) -> Volume:
        body = {"name": name} | ({"region": region} if region else {})
        return _from(Volume, self.api.request("POST", "/volumes", json=body))

    def get(self, id_or_name: str) -> Volume:
        return _from(Volume, self.api.request("GET", f"/volumes/{id_or_name}"))

    def list(self) -> list[Volume]:
        return [_from(Volume, v) for v in self.api.paginate("/volumes")]

    def files(self, volume: str, *, prefix: str = "") -> list[VolumeFile]:
        params = {"prefix": prefix} if prefix else None
        return [_from(VolumeFile, f) for f in self.api.paginate(f"/volumes/{volume}/files", params)]

    def delete(self, volume: str, *, confirm: str | None = None, force: bool = False) -> None:
        """Without `confirm` equal to the volume's name (or `force`), the API refuses with
        `confirmation_required`, carrying `file_count` and `total_bytes`."""
        params = {"confirm": confirm} if confirm is not None else {}
        if force:
            params["force"] = "true"
        self.api.request("DELETE", f"/volumes/{volume}", params=params)

    def usage(self, volume: str) -> list[dict]:
        return list(self.api.paginate(f"/volumes/{volume}/usage"))

    def upload_file(
        self,
        volume: str,
        local_path: str | os.PathLike,
        *,
        path: str | None = None,
        on_bytes: OnBytes | None = None,
        on_total: Callable[[int], None] | None = None,
    ) -> VolumeFile | None:
        """Upload one file (multipart with parallel parts above the server's threshold).
        Returns None when the same size and sha256 were already stored at that path."""
        local = Path(local_path)
        announced = {
            "path": path or local.name,
            "size": local.stat().st_size,
            "sha256": sha256_file(local),
        }
        answer = self.api.request("POST", f"/volumes/{volume}/files", json=announced)
        if answer.get("skipped"):
            return None
        if on_total:
            on_total(announced["size"])
        with ThreadPoolExecutor(MAX_PARALLEL) as pool:
            completions, failures = self._transfer(
                pool, [answer], [], {answer["path"]: local}, on_bytes
            )
        if failures:
            raise UploadFailed(failures)
        body = {k: v for k, v in completions[0].items() if k != "upload_id"}
        done = self.api.request(
            "POST", f"/volumes/{volume}/uploads/{answer['upload_id']}/complete", json=body
        )
        return _from(VolumeFile, done)

    def upload_dir(
        self,
        volume: str,
        local_dir: str | os.PathLike,
        *,
        prefix: str = "",
        on_bytes: OnBytes | None = None,
        on_total: Callable[[int], None] | None = None,
        max_parallel: int = MAX_PARALLEL,
        small_parallel: int = SMALL_PARALLEL,
    ) -> UploadDirResult:
        """Upload a folder, up to `max_parallel` transfers of large files at once and
        `small_parallel` of small ones, starting and completing files in batch calls; files
        already stored with the same size and sha256 are skipped. Files up to 1 MiB travel in
        packs, many to one PUT."""
        root = Path(local_dir)
        local_files = sorted(p for p in root.rglob("*") if p.is_file())
        by_path = {
            f"{prefix.strip('/')}/{p.relative_to(root).as_posix()}".lstrip("/"): p
            for p in local_files
        }
        result, failures = UploadDirResult([], [], 0), {}
        large = {path: p for path, p in by_path.items() if p.stat().st_size >= LARGE_FILE}
        with ThreadPoolExecutor(max_parallel) as pool:
            uploads = {
                pool.submit(
                    self.upload_file, volume, local, path=path, on_bytes=on_bytes, on_total=on_total
                ): path
                for path, local in large.items()
            }
            for future in as_completed(uploads):
                path = uploads[future]
                try:
                    file = future.result()
                except VeriAPIError as exc:
                    failures[path] = exc.message
                    continue
                if file is None:
                    result.skipped.append(path)
                else:
                    result.uploaded.append(path)
                    result.bytes_uploaded += file.size
        small = {path: p for path, p in by_path.items() if path not in large}
        # A small file is one PUT whose time is mostly its round trip to the store: many go at
        # once. The first batch is small so transfers start while later ones are announced, and
        # each batch's transfers and completion run in their own thread, so the next batch's
        # PUTs queue behind the last ones instead of waiting for the slowest of them.
        with (
            ThreadPoolExecutor(max(max_parallel, small_parallel)) as pool,
            ThreadPoolExecutor(BATCHES_AHEAD) as senders,
        ):
            hashes = pool.map(sha256_file, small.values())
            announced = [
                {"path": path, "size": local.stat().st_size, "sha256": digest}
                for (path, local), digest in zip(small.items(), hashes, strict=True)
            ]
            cuts = [0, *range(FIRST_BATCH, len(announced), BATCH), len(announced)]
            batches = [announced[a:b] for a, b in pairwise(cuts)]

            def start(batch: list[dict]) -> dict:
                body = {"files": batch, "pack": True}
                return self.api.request("POST", f"/volumes/{volume}/uploads:batch", json=body)

            def send(
                to_send: list[dict], packs: list[dict]
            ) -> tuple[list[dict], list[dict], dict[str, str]]:
                completions, send_failures = self._transfer(pool, to_send, packs, by_path, on_bytes)
                if not completions:
                    return to_send, [], send_failures
                body = {"uploads": completions}
                done = self.api.request("POST", f"/volumes/{volume}/uploads:complete", json=body)
                return to_send, done["data"], send_failures

            sending: deque = deque()
            for batch in filter(None, batches):
                if len(sending) >= BATCHES_AHEAD:  # URLs signed long before use could expire
                    sending[0].result()
                started = start(batch)
                answers = started["data"]
                to_send = [a for a in answers if not a.get("skipped")]
                result.skipped += [a["path"] for a in answers if a.get("skipped")]
                if on_total:
                    on_total(sum(by_path[a["path"]].stat().st_size for a in to_send))
                sending.append(senders.submit(send, to_send, started.get("packs", [])))
                while sending and sending[0].done():
                    self._sent(sending.popleft().result(), result, failures)
            while sending:
                self._sent(sending.popleft().result(), result, failures)
        if failures:
            raise UploadFailed(failures)
        return result

    @staticmethod
    def _sent(
        sent: tuple[list[dict], list[dict], dict[str, str]],
        result: UploadDirResult,
        failures: dict[str, str],
    ) -> None:
        """A batch's transfers and completion, added to `result` and `failures`."""
        to_send, completed, send_failures = sent
        failures |= send_failures
        paths = {a["upload_id"]: a["path"] for a in to_send}
        for item in completed:
            if item["ok"]:
                result.uploaded.append(paths[item["upload_id"]])
                result.bytes_uploaded += item["file"]["size"]
            else:
                failures[paths[item["upload_id"]]] = item["error"]["message"]

    def _transfer(
        self,
        pool: ThreadPoolExecutor,
        answers: list[dict],
        packs: list[dict],
        local: dict[str, Path],
        on_bytes: OnBytes | None,
    ) -> tuple[list[dict], dict[str, str]]:
        """PUT every file (each part of a multipart file, each pack of packed ones) through
        `pool`; returns the completion entries of the files whose bytes all arrived, and the
        reasons of those that did not."""
        puts = []
        packed: dict[int, list[dict]] = {}
        for answer in answers:
            if answer["method"] == "packed":  # sized from the answer's offsets, below
                packed.setdefault(answer["pack"], []).append(answer)
                continue
            path = local[answer["path"]]
            size = path.stat().st_size
            if answer["method"] == "single":
                headers = answer.get("headers") or {}
                body = _reader([(path, 0, size)], on_bytes)
                future = pool.submit(
                    self.storage.put, answer["url"], length=size, body=body, headers=headers
                )
                puts.append((answer, None, future))
                continue
            part_size = answer["part_size"]
            for part in answer["parts"]:
                offset = (part["number"] - 1) * part_size
                length = min(part_size, size - offset)
                future = pool.submit(self._put_part, part["url"], path, offset, length, on_bytes)
                puts.append((answer, part["number"], future))
        for index, members in packed.items():
            pack = packs[index]
            members.sort(key=lambda answer: answer["offset"])
            # Each file's size as announced (where the next one starts): a file changed since
            # then fails alone, its bytes no longer hashing to its sha256.
            ends = [a["offset"] for a in members[1:]] + [pack["size"]]
            segments = [
                (local[a["path"]], 0, end - a["offset"])
                for a, end in zip(members, ends, strict=True)
            ]
            body = _reader(segments, on_bytes)
            future = pool.submit(
                self.storage.put,
                pack["url"],
                length=pack["size"],
                body=body,
                headers=pack["headers"],
            )
            puts += [(answer, None, future) for answer in members]
        entries: dict[str, dict] = {}
        failures: dict[str, str] = {}
        for answer, number, future in puts:
            entry = entries.setdefault(answer["upload_id"], {"upload_id": answer["upload_id"]})
            try:
                etag = future.result()
            except VeriAPIError as exc:
                failures[answer["path"]] = exc.message
                continue
            if number is not None:
                entry.setdefault("parts", []).append({"number": number, "etag": etag})
        failed_ids = {a["upload_id"] for a in answers if a["path"] in failures}
        return [e for upload_id, e in entries.items() if upload_id not in failed_ids], failures

    def _put_part(
        self, url: str, path: Path, offset: int, length: int, on_bytes: OnBytes | None
    ) -> str:
        """A part goes with its Content-MD5, which the store checks: a corrupted part is refused."""
        digest = hashlib.md5(usedforsecurity=False)
        for chunk in _reader([(path, offset, length)], None)():
            digest.update(chunk)
        headers = {"Content-MD5": base64.b64encode(digest.digest()).decode()}
        body = _reader([(path, offset, length)], on_bytes)
        return self.storage.put(url, length=length, body=body, headers=headers)
