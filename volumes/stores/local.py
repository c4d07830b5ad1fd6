"""`LocalStore`: a folder as an object store, with HMAC-signed URLs served by the control plane."""

import base64
import hashlib
import io
import json
import os
import re
import shutil
import tempfile
import time
import uuid
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime
from pathlib import Path

from django.core import signing
from django.urls import reverse

from volumes.stores.base import (
    HASH_CHUNK,
    BadDigest,
    MultipartInProgress,
    ObjectExists,
    ObjectStore,
    StoredObject,
    StoreError,
)
from volumes.stores.keys import KeyRefused, check_key

SIGNING_SALT = "veri.localstore"
UPLOAD_ID_RE = re.compile(r"[0-9a-f]{32}")


class LocalStore(ObjectStore):
    """A folder as an object store, for the embedded default. Writes are atomic (temp + rename)."""

    def __init__(self, root: str, *, base_url: str):
        self.base_url = base_url.rstrip("/")  # where the control plane serves its signed URLs
        self.root = Path(root)
        self.objects = self.root / "objects"
        self.multipart = self.root / "multipart"

    def _path(self, key: str) -> Path:
        path = (self.objects / check_key(key)).resolve()
        if not path.is_relative_to(self.objects.resolve()):
            raise KeyRefused(f"key {key!r} leaves the store")
        return path

    def sign(self, **claims) -> str:
        token = signing.dumps(claims, salt=SIGNING_SALT, compress=True)
        return self.base_url + reverse("local-store", args=[token])

    @staticmethod
    def verify(token: str) -> dict:
        """The claims of a URL token; raises StoreError when tampered with or expired."""
        try:
            claims = signing.loads(token, salt=SIGNING_SALT)
        except signing.BadSignature:
            raise StoreError("invalid_signature") from None
        if claims["exp"] < time.time():
            raise StoreError("signature_expired")
        return claims

    def presign_put(
        self, key: str, *, expires: int, sha256: str | None = None, create_only: bool = False
    ) -> tuple[str, dict[str, str]]:
        self._path(key)
        claims = {"op": "put", "key": key, "sha256": sha256, "exp": time.time() + expires}
        if create_only:  # in the signed claims; the header only says so as S3's would
            return self.sign(**claims, create_only=True), {"If-None-Match": "*"}
        return self.sign(**claims), {}

    def presign_get(self, key: str, *, expires: int) -> str:
        self._path(key)
        return self.sign(op="get", key=key, exp=time.time() + expires)

    def create_multipart(self, key: str) -> str:
        self._path(key)
        upload_id = uuid.uuid4().hex
        folder = self.multipart / upload_id
        folder.mkdir(parents=True)
        meta = {"key": key, "initiated": datetime.now(UTC).isoformat()}
        (folder / "meta.json").write_text(json.dumps(meta))
        return upload_id

    def presign_part(self, key: str, *, upload_id: str, number: int, expires: int) -> str:
        self._path(key)
        return self.sign(
            op="part", key=key, upload_id=upload_id, number=number, exp=time.time() + expires
        )

    def _upload_dir(self, upload_id: str) -> Path:
        if not UPLOAD_ID_RE.fullmatch(upload_id):
            raise StoreError(f"no multipart upload {upload_id!r}")
        return self.multipart / upload_id

    def _upload_folder(self, key: str, upload_id: str) -> Path:
        folder = self._upload_dir(upload_id)
        try:
            meta = json.loads((folder / "meta.json").read_text())
        except (FileNotFoundError, ValueError):
            raise StoreError(f"no multipart upload {upload_id}") from None
        if meta["key"] != key:
            raise StoreError(f"multipart upload {upload_id} is not for {key}")
        return folder

    def write_part(
        self, key: str, *, upload_id: str, number: int, stream, content_md5: str | None = None
    ) -> str:
        folder = self._upload_folder(key, upload_id)
        return self._write(folder / f"{number:05d}.part", _chunks(stream), content_md5=content_md5)

    def complete_multipart(self, key: str, *, upload_id: str, parts: list[tuple[int, str]]) -> None:
        folder = self._upload_folder(key, upload_id)
        paths = []
        for number, etag in sorted(parts):
            path = folder / f"{number:05d}.part"
            if not path.exists():
                raise StoreError(f"part {number} was never uploaded")
            if _md5_file(path) != etag.strip('"'):
                raise StoreError(f"part {number} does not match its ETag")
            paths.append(path)

        def joined():
            for path in paths:
                with path.open("rb") as part:
                    yield from _chunks(part)

        self._write(self._path(key), joined())
        shutil.rmtree(folder, ignore_errors=True)

    def abort_multipart(self, key: str, *, upload_id: str) -> None:
        shutil.rmtree(self._upload_dir(upload_id), ignore_errors=True)

    def list_multipart(self, prefix: str) -> list[MultipartInProgress]:
        found = []
        if not self.multipart.exists():
            return found
        for folder in self.multipart.iterdir():
            try:
                meta = json.loads((folder / "meta.json").read_text())
            except (FileNotFoundError, ValueError):
                continue
            if meta["key"].startswith(prefix):
                initiated = datetime.fromisoformat(meta["initiated"])
                found.append(MultipartInProgress(meta["key"], folder.name, initiated))
        return found

    def head(self, key: str) -> StoredObject | None:
        path = self._path(key)
        return StoredObject(key, path.stat().st_size) if path.is_file() else None

    def iter_objects(self, prefix: str) -> Iterator[StoredObject]:
        # Walk only the deepest folder named by the prefix, then filter on the rest.
        check_key(prefix, folder=True)
        base = self.objects / prefix[: prefix.rfind("/") + 1] if "/" in prefix else self.objects
        if not base.is_dir():
            return
        for dirpath, dirnames, filenames in os.walk(base):
            dirnames.sort()
            for name in sorted(filenames):
                path = Path(dirpath) / name
                key = path.relative_to(self.objects).as_posix()
                if key.startswith(prefix) and not name.startswith(".tmp-"):
                    yield StoredObject(key, path.stat().st_size)

    def open(self, key: str, *, byte_range: tuple[int, int] | None = None):
        try:
            stream = self._path(key).open("rb")
        except (FileNotFoundError, IsADirectoryError):
            raise StoreError(f"{key}: no such object") from None
        if byte_range is None:
            return stream
        first, last = byte_range
        with stream:  # a range is of a pack (at most 16 MiB): read into memory
            stream.seek(first)
            return io.BytesIO(stream.read(last - first + 1))

    def put_bytes(self, key: str, data: bytes) -> None:
        self._write(self._path(key), [data])

    def put_stream(self, key: str, chunks: Iterable[bytes]) -> int:
        path = self._path(key)
        size = 0

        def counted():
            nonlocal size
            for chunk in chunks:
                size += len(chunk)
                yield chunk

        self._write(path, counted())
        return size

    def write(
        self,
        key: str,
        stream,
        *,
        sha256: str | None = None,
        content_md5: str | None = None,
        create_only: bool = False,
    ) -> str:
        path = self._path(key)
        if create_only and path.exists():  # refused before a byte is read; the link decides
            raise ObjectExists(f"{key} is already stored")
        return self._write(
            path, _chunks(stream), sha256=sha256, content_md5=content_md5, create_only=create_only
        )

    def delete(self, keys: Iterable[str]) -> None:
        for key in keys:
            path = self._path(key)
            path.unlink(missing_ok=True)
            # Remove folders the delete left empty, up to the store root.
            for parent in path.parents:
                if parent == self.objects or not parent.is_relative_to(self.objects):
                    break
                try:
                    parent.rmdir()
                except OSError:
                    break

    @staticmethod
    def _write(
        path: Path,
        chunks: Iterable[bytes],
        *,
        sha256: str | None = None,
        content_md5: str | None = None,
        create_only: bool = False,
    ) -> str:
        """Write `chunks` atomically, one at a time; returns the MD5 hex digest (the ETag S3
        would give). Like S3, refuses (`BadDigest`) a body that does not match the SHA-256 or
        Content-MD5 it was sent with, and with `create_only` (`ObjectExists`) a path already
        there, even when two writes race: a hard link, unlike a rename, never replaces its
        target."""
        path.parent.mkdir(parents=True, exist_ok=True)
        md5, sha = hashlib.md5(usedforsecurity=False), hashlib.sha256()
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as out:
                for chunk in chunks:
                    md5.update(chunk)
                    sha.update(chunk)
                    out.write(chunk)
            if sha256 and sha.hexdigest() != sha256:
                raise BadDigest(f"the body's SHA-256 is {sha.hexdigest()}, not {sha256}")
            if content_md5 and base64.b64encode(md5.digest()).decode() != content_md5:
                raise BadDigest("the body does not match its Content-MD5")
            if create_only:
                try:
                    os.link(tmp, path)
                except FileExistsError:
                    raise ObjectExists(f"{path.name} is already stored") from None
                os.unlink(tmp)
            else:
                os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return md5.hexdigest()


def _chunks(stream) -> Iterator[bytes]:
    """A readable stream as chunks of at most HASH_CHUNK bytes."""
    while chunk := stream.read(HASH_CHUNK):
        yield chunk


def _md5_file(path: Path) -> str:
    digest = hashlib.md5(usedforsecurity=False)
    with path.open("rb") as f:
        while chunk := f.read(HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()
