"""The object-store interface: keys are relative to the store's root prefix."""

import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from veri.errors import ServiceUnavailable

HASH_CHUNK = 1024 * 1024
DELETE_BATCH = 1000  # S3's DeleteObjects limit


@dataclass(frozen=True, slots=True)
class StoredObject:
    key: str
    size: int
    etag: str = ""


@dataclass(frozen=True, slots=True)
class MultipartInProgress:
    key: str
    upload_id: str
    initiated: datetime


def range_header(byte_range: tuple[int, int]) -> dict[str, str]:
    """The HTTP header that reads bytes `first..last` (both included) of an object."""
    return {"Range": "bytes={}-{}".format(*byte_range)}


class StoreError(Exception):
    """The store refused or failed an operation."""


class BadDigest(StoreError):
    """The body did not match the checksum it was sent with; nothing was stored."""


class StoreUnavailable(StoreError, ServiceUnavailable):
    """The store could not be reached, or answered with its own server error after the client's
    retries: the request is answered 503 with `Retry-After`, and nothing was recorded."""

    code = "store_unavailable"

    def __init__(self, reason: str):
        super().__init__(
            f"The object store is unreachable for a moment ({reason}); nothing was recorded. "
            "Retry the request."
        )


class ObjectExists(StoreError):
    """A create-only write found the object already there (S3's 412 to `If-None-Match: *`);
    what is stored was kept."""


class ObjectStore:
    def presign_put(
        self, key: str, *, expires: int, sha256: str | None = None, create_only: bool = False
    ) -> tuple[str, dict[str, str]]:
        """A URL for one PUT, and the headers the client must send with it. With `sha256`, the
        store itself refuses a body whose SHA-256 differs (S3 checks its signed
        `x-amz-checksum-sha256`), so nothing is read back to verify it. With `create_only`, the
        URL can only create the object: once one is stored there, sending it again is refused
        (HTTP 412; S3's signed `If-None-Match: *`), so what was verified cannot be replaced."""
        ...

    def presign_get(self, key: str, *, expires: int) -> str: ...
    def create_multipart(self, key: str) -> str: ...
    def presign_part(self, key: str, *, upload_id: str, number: int, expires: int) -> str: ...
    def complete_multipart(
        self, key: str, *, upload_id: str, parts: list[tuple[int, str]]
    ) -> None: ...
    def abort_multipart(self, key: str, *, upload_id: str) -> None: ...
    def list_multipart(self, prefix: str) -> list[MultipartInProgress]: ...
    def head(self, key: str) -> StoredObject | None: ...
    def iter_objects(self, prefix: str) -> Iterator[StoredObject]: ...
    def open(self, key: str, *, byte_range: tuple[int, int] | None = None):
        """A readable stream of the object, or of its bytes `first..last` (both included)."""
        ...

    def put_bytes(self, key: str, data: bytes) -> None: ...

    def put_stream(self, key: str, chunks: Iterable[bytes]) -> int:
        """Store the concatenation of `chunks` as one object without holding it in memory (at
        most one upload part of it, on S3); returns its size. Nothing is stored when `chunks`
        raises."""
        ...

    def iter_bytes(
        self,
        key: str,
        *,
        chunk_size: int = HASH_CHUNK,
        byte_range: tuple[int, int] | None = None,
    ) -> Iterator[bytes]:
        """The object's bytes (or those of `byte_range`), `chunk_size` at a time. The object is
        opened now (StoreError when there is none), read as the iterator is consumed, and closed
        when it ends or is closed."""
        stream = self.open(key, byte_range=byte_range)

        def chunks() -> Iterator[bytes]:
            try:
                while chunk := stream.read(chunk_size):
                    yield chunk
            finally:
                stream.close()

        return chunks()

    def delete(self, keys: Iterable[str]) -> None: ...

    def read_grant(self, prefix: str, keys: list[str], *, ttl: int) -> tuple[dict, dict]:
        """Short-lived read access to `keys` under `prefix`: credentials for the prefix, and per
        key where to fetch it (`{"key": …}` with the credentials, or a signed `{"url": …}`).

        Here, a presigned GET URL per key, valid for `ttl` seconds: what any store can sign.
        `expiration` says when the URLs stop working, so the holder asks again before then (a
        GET that started in time runs to its end)."""
        expiration = datetime.now(UTC) + timedelta(seconds=ttl)
        where = {key: {"url": self.presign_get(key, expires=ttl)} for key in keys}
        return {"kind": "signed_urls", "expiration": expiration.isoformat()}, where

    def get_bytes(self, key: str, *, byte_range: tuple[int, int] | None = None) -> bytes:
        with self.open(key, byte_range=byte_range) as stream:
            return stream.read()

    def stat_many(self, keys: list[str]) -> dict[str, StoredObject]:
        """The stored objects among `keys`: one listing when they share a folder, not one each."""
        if len(keys) < 4:
            return {key: obj for key in keys if (obj := self.head(key))}
        prefix = os.path.commonprefix(keys)
        prefix = prefix[: prefix.rfind("/") + 1]
        wanted, found = set(keys), {}
        budget = (
            4 * len(keys) + 1000
        )  # past this, the folder holds mostly other files: head instead
        for seen, obj in enumerate(self.iter_objects(prefix)):
            if obj.key in wanted:
                found[obj.key] = obj
                if len(found) == len(wanted):
                    return found
            if seen > budget:
                break
        for key in wanted - found.keys():
            if obj := self.head(key):
                found[key] = obj
        return found

    def delete_prefix(self, prefix: str) -> int:
        """Delete every object under `prefix` (which must end with `/`), in batches."""
        if not prefix.endswith("/"):
            raise ValueError("A prefix to delete must end with '/', or 'data' would take 'data2'.")
        deleted, batch = 0, []
        for obj in self.iter_objects(prefix):
            batch.append(obj.key)
            if len(batch) == DELETE_BATCH:
                self.delete(batch)
                deleted, batch = deleted + len(batch), []
        if batch:
            self.delete(batch)
            deleted += len(batch)
        for upload in self.list_multipart(prefix):
            self.abort_multipart(upload.key, upload_id=upload.upload_id)
        return deleted
