"""Object stores behind one small interface: `S3Store` (any S3 API) and `LocalStore` (a folder).

Keys are relative to the store's root prefix. Presigned URLs let clients move bytes without the
control plane in the path; `LocalStore`'s are HMAC-signed URLs that the control plane serves.
"""

import hashlib
import json
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import cache
from pathlib import Path
from urllib.parse import urlsplit

import boto3
from botocore.config import Config
from botocore.exceptions import ClientError
from django.conf import settings
from django.core import signing
from django.urls import reverse

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


class StoreError(Exception):
    """The store refused or failed an operation."""


class ObjectStore:
    def presign_put(self, key: str, *, expires: int) -> str: ...
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
    def open(self, key: str): ...
    def put_bytes(self, key: str, data: bytes) -> None: ...
    def delete(self, keys: Iterable[str]) -> None: ...

    def sha256(self, key: str) -> str:
        digest = hashlib.sha256()
        with self.open(key) as stream:
            while chunk := stream.read(HASH_CHUNK):
                digest.update(chunk)
        return digest.hexdigest()

    def get_bytes(self, key: str) -> bytes:
        with self.open(key) as stream:
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


class S3Store(ObjectStore):
    def __init__(self, bucket: str, root: str = "", *, endpoint_url: str | None = None):
        self.bucket, self.root = bucket, root.strip("/") + "/" if root.strip("/") else ""
        config = Config(
            signature_version="s3v4",
            retries={"max_attempts": 5, "mode": "standard"},
            max_pool_connections=32,
        )
        session = boto3.session.Session(region_name=settings.AWS_REGION)
        self.endpoint_url = endpoint_url
        self.client = session.client("s3", endpoint_url=endpoint_url, config=config)
        self.sts = session.client("sts", endpoint_url=endpoint_url)

    def _key(self, key: str) -> str:
        return self.root + key

    def _unkey(self, full: str) -> str:
        return full[len(self.root) :]

    def presign_put(self, key: str, *, expires: int) -> str:
        params = {"Bucket": self.bucket, "Key": self._key(key)}
        return self.client.generate_presigned_url("put_object", Params=params, ExpiresIn=expires)

    def presign_get(self, key: str, *, expires: int) -> str:
        params = {"Bucket": self.bucket, "Key": self._key(key)}
        return self.client.generate_presigned_url("get_object", Params=params, ExpiresIn=expires)

    def create_multipart(self, key: str) -> str:
        answer = self.client.create_multipart_upload(Bucket=self.bucket, Key=self._key(key))
        return answer["UploadId"]

    def presign_part(self, key: str, *, upload_id: str, number: int, expires: int) -> str:
        params = {
            "Bucket": self.bucket,
            "Key": self._key(key),
            "UploadId": upload_id,
            "PartNumber": number,
        }
        return self.client.generate_presigned_url("upload_part", Params=params, ExpiresIn=expires)

    def complete_multipart(self, key: str, *, upload_id: str, parts: list[tuple[int, str]]) -> None:
        try:
            self.client.complete_multipart_upload(
                Bucket=self.bucket,
                Key=self._key(key),
                UploadId=upload_id,
                MultipartUpload={
                    "Parts": [{"PartNumber": n, "ETag": etag} for n, etag in sorted(parts)]
                },
            )
        except ClientError as exc:
            raise StoreError(exc.response["Error"].get("Message") or str(exc)) from exc

    def abort_multipart(self, key: str, *, upload_id: str) -> None:
        try:
            self.client.abort_multipart_upload(
                Bucket=self.bucket, Key=self._key(key), UploadId=upload_id
            )
        except ClientError as exc:
            if exc.response["Error"]["Code"] != "NoSuchUpload":
                raise

    def list_multipart(self, prefix: str) -> list[MultipartInProgress]:
        found = []
        paginator = self.client.get_paginator("list_multipart_uploads")
        for page in paginator.paginate(Bucket=self.bucket, Prefix=self._key(prefix)):
            for upload in page.get("Uploads", []):
                found.append(
                    MultipartInProgress(
                        self._unkey(upload["Key"]), upload["UploadId"], upload["Initiated"]
                    )
                )
        return found

    def head(self, key: str) -> StoredObject | None:
        try:
            answer = self.client.head_object(Bucket=self.bucket, Key=self._key(key))
        except ClientError as exc:
            if exc.response["Error"]["Code"] in {"404", "NoSuchKey", "NotFound"}:
                return None
            raise
        return StoredObject(key, answer["ContentLength"], answer.get("ETag", "").strip('"'))

    def iter_objects(self, prefix: str) -> Iterator[StoredObject]:
        paginator = self.client.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=self.bucket, Prefix=self._key(prefix)):
            for item in page.get("Contents", []):
                yield StoredObject(self._unkey(item["Key"]), item["Size"], item["ETag"].strip('"'))

    def open(self, key: str):
        try:
            return self.client.get_object(Bucket=self.bucket, Key=self._key(key))["Body"]
        except ClientError as exc:
            raise StoreError(f"{key}: {exc.response['Error'].get('Message') or exc}") from exc

    def put_bytes(self, key: str, data: bytes) -> None:
        self.client.put_object(Bucket=self.bucket, Key=self._key(key), Body=data)

    def delete(self, keys: Iterable[str]) -> None:
        keys = list(keys)
        for start in range(0, len(keys), DELETE_BATCH):
            batch = [{"Key": self._key(k)} for k in keys[start : start + DELETE_BATCH]]
            answer = self.client.delete_objects(
                Bucket=self.bucket, Delete={"Objects": batch, "Quiet": True}
            )
            if answer.get("Errors"):
                first = answer["Errors"][0]
                raise StoreError(f"could not delete {first['Key']}: {first.get('Message')}")

    def scoped_policy(self, prefix: str, *, write: bool) -> dict:
        """An STS session policy: read-only (or write-only) on one prefix of the bucket."""
        full = self._key(prefix)
        objects = f"arn:aws:s3:::{self.bucket}/{full}*"
        if write:
            actions = ["s3:PutObject", "s3:AbortMultipartUpload", "s3:ListMultipartUploadParts"]
            return {
                "Version": "2012-10-17",
                "Statement": [{"Effect": "Allow", "Action": actions, "Resource": [objects]}],
            }
        return {
            "Version": "2012-10-17",
            "Statement": [
                {"Effect": "Allow", "Action": ["s3:GetObject"], "Resource": [objects]},
                {
                    "Effect": "Allow",
                    "Action": ["s3:ListBucket"],
                    "Resource": [f"arn:aws:s3:::{self.bucket}"],
                    "Condition": {"StringLike": {"s3:prefix": [f"{full}*"]}},
                },
            ],
        }

    def scoped_credentials(self, prefix: str, *, ttl: int = 1800, write: bool = False) -> dict:
        """Short-lived credentials limited to `prefix` (read-only unless `write`)."""
        answer = self.sts.assume_role(
            RoleArn=settings.VERI_STS_ROLE_ARN,
            RoleSessionName=f"veri-{uuid.uuid4().hex[:16]}",
            Policy=json.dumps(self.scoped_policy(prefix, write=write)),
            DurationSeconds=max(ttl, 900),  # STS's minimum
        )
        creds = answer["Credentials"]
        return {
            "kind": "s3",
            "access_key_id": creds["AccessKeyId"],
            "secret_access_key": creds["SecretAccessKey"],
            "session_token": creds["SessionToken"],
            "expiration": creds["Expiration"].isoformat(),
            "bucket": self.bucket,
            "prefix": self._key(prefix),
            "endpoint_url": self.endpoint_url,
            "region": settings.AWS_REGION,
        }


SIGNING_SALT = "veri.localstore"


class LocalStore(ObjectStore):
    """A folder as an object store, for the embedded default. Writes are atomic (temp + rename)."""

    def __init__(self, root: str):
        self.root = Path(root)
        self.objects = self.root / "objects"
        self.multipart = self.root / "multipart"

    def _path(self, key: str) -> Path:
        path = (self.objects / key).resolve()
        if not path.is_relative_to(self.objects.resolve()):
            raise StoreError(f"key {key!r} leaves the store")
        return path

    def sign(self, **claims) -> str:
        return reverse(
            "local-store", args=[signing.dumps(claims, salt=SIGNING_SALT, compress=True)]
        )

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

    def presign_put(self, key: str, *, expires: int) -> str:
        return self.sign(op="put", key=key, exp=time.time() + expires)

    def presign_get(self, key: str, *, expires: int) -> str:
        return self.sign(op="get", key=key, exp=time.time() + expires)

    def create_multipart(self, key: str) -> str:
        upload_id = uuid.uuid4().hex
        folder = self.multipart / upload_id
        folder.mkdir(parents=True)
        meta = {"key": key, "initiated": datetime.now(UTC).isoformat()}
        (folder / "meta.json").write_text(json.dumps(meta))
        return upload_id

    def presign_part(self, key: str, *, upload_id: str, number: int, expires: int) -> str:
        return self.sign(
            op="part", key=key, upload_id=upload_id, number=number, exp=time.time() + expires
        )

    def _upload_folder(self, key: str, upload_id: str) -> Path:
        folder = self.multipart / upload_id
        try:
            meta = json.loads((folder / "meta.json").read_text())
        except (FileNotFoundError, ValueError):
            raise StoreError(f"no multipart upload {upload_id}") from None
        if meta["key"] != key:
            raise StoreError(f"multipart upload {upload_id} is not for {key}")
        return folder

    def write_part(self, key: str, *, upload_id: str, number: int, stream) -> str:
        folder = self._upload_folder(key, upload_id)
        return self._write(folder / f"{number:05d}.part", stream)

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
                    yield from iter(lambda: part.read(HASH_CHUNK), b"")

        self._write(self._path(key), _IterStream(joined()))
        shutil.rmtree(folder, ignore_errors=True)

    def abort_multipart(self, key: str, *, upload_id: str) -> None:
        shutil.rmtree(self.multipart / upload_id, ignore_errors=True)

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

    def open(self, key: str):
        try:
            return self._path(key).open("rb")
        except (FileNotFoundError, IsADirectoryError):
            raise StoreError(f"{key}: no such object") from None

    def put_bytes(self, key: str, data: bytes) -> None:
        self._write(self._path(key), _IterStream(iter([data])))

    def write(self, key: str, stream) -> str:
        return self._write(self._path(key), stream)

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
    def _write(path: Path, stream) -> str:
        """Write atomically; returns the MD5 hex digest (the ETag S3 would give)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        digest = hashlib.md5(usedforsecurity=False)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as out:
                while chunk := stream.read(HASH_CHUNK):
                    digest.update(chunk)
                    out.write(chunk)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return digest.hexdigest()


class _IterStream:
    """A `read(n)` stream over an iterator of byte chunks."""

    def __init__(self, chunks: Iterator[bytes]):
        self.chunks, self.buffer = chunks, b""

    def read(self, size: int = -1) -> bytes:
        while size < 0 or len(self.buffer) < size:
            chunk = next(self.chunks, None)
            if chunk is None:
                break
            self.buffer += chunk
        if size < 0:
            data, self.buffer = self.buffer, b""
        else:
            data, self.buffer = self.buffer[:size], self.buffer[size:]
        return data


def _md5_file(path: Path) -> str:
    digest = hashlib.md5(usedforsecurity=False)
    with path.open("rb") as f:
        while chunk := f.read(HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def store_from_url(url: str, *, endpoint_url: str | None = None) -> ObjectStore:
    parts = urlsplit(url)
    if parts.scheme == "s3":
        return S3Store(parts.netloc, parts.path, endpoint_url=endpoint_url)
    if parts.scheme == "file":
        return LocalStore(parts.path)
    raise ValueError(f"VERI_STORE must be file:///path or s3://bucket/prefix, not {url!r}")


@cache
def _store_for(url: str, endpoint_url: str | None) -> ObjectStore:
    return store_from_url(url, endpoint_url=endpoint_url)


def get_store() -> ObjectStore:
    """The configured store; built on first use (not at import) and kept per setting value."""
    return _store_for(settings.VERI_STORE, settings.AWS_ENDPOINT_URL)
