"""`S3Store`: any S3 API (AWS, MinIO, Runpod S3, moto) through boto3."""

import base64
import hashlib
import hmac
import json
import threading
import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from functools import cache, cached_property
from urllib.parse import quote, urlsplit

import boto3
from botocore.config import Config
from botocore.exceptions import ClientError, HTTPClientError
from botocore.exceptions import ConnectionError as BotoConnectionError
from django.conf import settings

from volumes.stores.base import (
    DELETE_BATCH,
    MultipartInProgress,
    ObjectStore,
    StoredObject,
    StoreError,
    StoreUnavailable,
    range_header,
)
from volumes.stores.keys import check_key

# The part size of a streamed upload (`put_stream`): S3's smallest part but the last.
STREAM_PART_BYTES = 5 * 1024 * 1024


_SESSION_LOCK = threading.Lock()


@cache
def _session(region: str) -> boto3.session.Session:
    return boto3.session.Session(region_name=region)


def _client(service: str, **options):
    """A client on this process's one boto3 session: a session of its own would read and parse
    botocore's service model and endpoint rules again, ~50 ms of CPU a client. A session is not
    thread-safe (the clients it makes are), hence the lock."""
    with _SESSION_LOCK:
        return _session(settings.AWS_REGION).client(service, **options)


class S3Store(ObjectStore):
    def __init__(self, bucket: str, root: str = "", *, endpoint_url: str | None = None):
        self.bucket, self.root = bucket, root.strip("/") + "/" if root.strip("/") else ""
        config = Config(
            signature_version="s3v4",
            retries={"max_attempts": 5, "mode": "standard"},
            max_pool_connections=32,
            # A store that does not answer at all fails a request in seconds (503), not minutes.
            connect_timeout=5,
        )
        self.endpoint_url = endpoint_url
        self.client = _client("s3", endpoint_url=endpoint_url, config=config)
        self.presigner = Presigner(self.client, _session(settings.AWS_REGION), bucket)

    @cached_property
    def sts(self):
        """Made when scoped credentials are first asked for (most processes never do)."""
        return _client("sts", endpoint_url=self.endpoint_url)

    def full_key(self, key: str, *, folder: bool = False) -> str:
        """The object's key in the bucket (store keys are relative to the root prefix)."""
        return self.root + check_key(key, folder=folder)

    def _unkey(self, full: str) -> str:
        return full[len(self.root) :]

    def presign_put(
        self, key: str, *, expires: int, sha256: str | None = None, create_only: bool = False
    ) -> tuple[str, dict[str, str]]:
        # Both headers are signed: a client that leaves one out, or changes it, is refused.
        headers = {"x-amz-checksum-sha256": _b64(sha256)} if sha256 else {}
        if create_only:
            headers["If-None-Match"] = "*"  # S3's conditional write: 412 once the key exists
        return self.presigner.url(
            "PUT", self.full_key(key), expires=expires, headers=headers
        ), headers

    def presign_get(self, key: str, *, expires: int) -> str:
        return self.presigner.url("GET", self.full_key(key), expires=expires)

    def create_multipart(self, key: str) -> str:
        with _reaching():
            answer = self.client.create_multipart_upload(Bucket=self.bucket, Key=self.full_key(key))
        return answer["UploadId"]

    def presign_part(self, key: str, *, upload_id: str, number: int, expires: int) -> str:
        params = {"partNumber": str(number), "uploadId": upload_id}
        return self.presigner.url("PUT", self.full_key(key), expires=expires, params=params)

    def complete_multipart(self, key: str, *, upload_id: str, parts: list[tuple[int, str]]) -> None:
        try:
            with _reaching():
                self.client.complete_multipart_upload(
                    Bucket=self.bucket,
                    Key=self.full_key(key),
                    UploadId=upload_id,
                    MultipartUpload={
                        "Parts": [{"PartNumber": n, "ETag": etag} for n, etag in sorted(parts)]
                    },
                )
        except ClientError as exc:
            raise StoreError(exc.response["Error"].get("Message") or str(exc)) from exc

    def abort_multipart(self, key: str, *, upload_id: str) -> None:
        try:
            with _reaching():
                self.client.abort_multipart_upload(
                    Bucket=self.bucket, Key=self.full_key(key), UploadId=upload_id
                )
        except ClientError as exc:
            if exc.response["Error"]["Code"] != "NoSuchUpload":
                raise

    def list_multipart(self, prefix: str) -> list[MultipartInProgress]:
        found = []
        paginator = self.client.get_paginator("list_multipart_uploads")
        with _reaching():
            for page in paginator.paginate(
                Bucket=self.bucket, Prefix=self.full_key(prefix, folder=True)
            ):
                for upload in page.get("Uploads", []):
                    found.append(
                        MultipartInProgress(
                            self._unkey(upload["Key"]), upload["UploadId"], upload["Initiated"]
                        )
                    )
        return found

    def head(self, key: str) -> StoredObject | None:
        try:
            with _reaching():
                answer = self.client.head_object(Bucket=self.bucket, Key=self.full_key(key))
        except ClientError as exc:
            if exc.response["Error"]["Code"] in {"404", "NoSuchKey", "NotFound"}:
                return None
            raise
        return StoredObject(key, answer["ContentLength"], answer.get("ETag", "").strip('"'))

    def iter_objects(self, prefix: str) -> Iterator[StoredObject]:
        paginator = self.client.get_paginator("list_objects_v2")
        pages = iter(
            paginator.paginate(Bucket=self.bucket, Prefix=self.full_key(prefix, folder=True))
        )
        while True:
            with _reaching():  # around each page's request, never around the caller's work
                page = next(pages, None)
            if page is None:
                return
            for item in page.get("Contents", []):
                yield StoredObject(self._unkey(item["Key"]), item["Size"], item["ETag"].strip('"'))

    def open(self, key: str, *, byte_range: tuple[int, int] | None = None):
        ranged = range_header(byte_range) if byte_range else {}
        try:
            with _reaching():
                answer = self.client.get_object(
                    Bucket=self.bucket, Key=self.full_key(key), **ranged
                )
                return answer["Body"]
        except ClientError as exc:
            raise StoreError(f"{key}: {exc.response['Error'].get('Message') or exc}") from exc

    def put_bytes(self, key: str, data: bytes) -> None:
        with _reaching():
            self.client.put_object(Bucket=self.bucket, Key=self.full_key(key), Body=data)

    def put_stream(self, key: str, chunks: Iterable[bytes]) -> int:
        """One PUT when it all fits in a part; else a multipart upload, a part as soon as
        STREAM_PART_BYTES have gathered (S3's smallest part but the last is 5 MiB), so that at
        most about one part is in memory. An upload that fails is aborted."""
        full, buffer, parts, size, upload_id = self.full_key(key), bytearray(), [], 0, None
        try:
            for chunk in chunks:
                buffer += chunk
                size += len(chunk)
                if len(buffer) >= STREAM_PART_BYTES:
                    if upload_id is None:
                        upload_id = self.client.create_multipart_upload(
                            Bucket=self.bucket, Key=full
                        )["UploadId"]
                    parts.append(self._upload_part(full, upload_id, len(parts) + 1, buffer))
                    buffer = bytearray()
            if upload_id is None:
                self.client.put_object(Bucket=self.bucket, Key=full, Body=buffer)
                return size
            if buffer:
                parts.append(self._upload_part(full, upload_id, len(parts) + 1, buffer))
            self.client.complete_multipart_upload(
                Bucket=self.bucket,
                Key=full,
                UploadId=upload_id,
                MultipartUpload={"Parts": parts},
            )
        except BaseException:
            if upload_id is not None:
                self.abort_multipart(key, upload_id=upload_id)
            raise
        return size

    def _upload_part(self, full: str, upload_id: str, number: int, body: bytearray) -> dict:
        answer = self.client.upload_part(
            Bucket=self.bucket, Key=full, UploadId=upload_id, PartNumber=number, Body=body
        )
        return {"PartNumber": number, "ETag": answer["ETag"]}

    def delete(self, keys: Iterable[str]) -> None:
        keys = list(keys)
        for start in range(0, len(keys), DELETE_BATCH):
            batch = [{"Key": self.full_key(k)} for k in keys[start : start + DELETE_BATCH]]
            with _reaching():
                answer = self.client.delete_objects(
                    Bucket=self.bucket, Delete={"Objects": batch, "Quiet": True}
                )
            if answer.get("Errors"):
                first = answer["Errors"][0]
                raise StoreError(f"could not delete {first['Key']}: {first.get('Message')}")

    def read_grant(self, prefix: str, keys: list[str], *, ttl: int) -> tuple[dict, dict]:
        """STS credentials scoped to `prefix` when a role is configured (`VERI_STS_ROLE_ARN`);
        without one (a store with no STS endpoint) a presigned GET URL per key, as any store."""
        if not settings.VERI_STS_ROLE_ARN:
            return super().read_grant(prefix, keys, ttl=ttl)
        credentials = self.scoped_credentials(prefix, ttl=ttl)
        return credentials, {key: {"key": self.full_key(key)} for key in keys}

    def scoped_policy(self, prefix: str) -> dict:
        """An STS session policy: read-only on one prefix of the bucket. The folder's trailing
        `/` is what keeps `vol_1` from reaching `vol_10`. With a KMS key
        (`VERI_STORE_KMS_KEY_ARN`), kms:Decrypt on that key alone, and only through S3, which
        SSE-KMS objects need to be read. (Workers write through presigned PUTs, one per file,
        with its sha256 signed in: no write credentials exist.)"""
        full = self.full_key(prefix, folder=True)
        statements = [
            {
                "Effect": "Allow",
                "Action": ["s3:GetObject"],
                "Resource": [f"arn:aws:s3:::{self.bucket}/{full}*"],
            },
            {
                "Effect": "Allow",
                "Action": ["s3:ListBucket"],
                "Resource": [f"arn:aws:s3:::{self.bucket}"],
                "Condition": {"StringLike": {"s3:prefix": [f"{full}*"]}},
            },
        ]
        if key := settings.VERI_STORE_KMS_KEY_ARN:
            through_s3 = {"kms:ViaService": f"s3.{settings.AWS_REGION}.amazonaws.com"}
            statements.append(
                {
                    "Effect": "Allow",
                    "Action": ["kms:Decrypt"],
                    "Resource": [key],
                    "Condition": {"StringEquals": through_s3},
                }
            )
        return {"Version": "2012-10-17", "Statement": statements}

    def scoped_credentials(self, prefix: str, *, ttl: int = 1800) -> dict:
        """Short-lived read-only credentials limited to `prefix`."""
        with _reaching():
            answer = self.sts.assume_role(
                RoleArn=settings.VERI_STS_ROLE_ARN,
                RoleSessionName=f"veri-{uuid.uuid4().hex[:16]}",
                Policy=json.dumps(self.scoped_policy(prefix)),
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
            "prefix": self.full_key(prefix, folder=True),
            "endpoint_url": self.endpoint_url,
            "region": settings.AWS_REGION,
        }


@contextmanager
def _reaching():
    """The store being away (no connection, a timeout, its own 5xx after botocore's retries) is
    `StoreUnavailable`, answered 503 with Retry-After; its other answers stay as they were."""
    try:
        yield
    except (BotoConnectionError, HTTPClientError) as exc:
        raise StoreUnavailable(type(exc).__name__) from exc
    except ClientError as exc:
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0
        if status >= 500:
            raise StoreUnavailable(
                f"HTTP {status} {exc.response['Error'].get('Code', '')}"
            ) from exc
        raise


def _b64(hex_digest: str) -> str:
    return base64.b64encode(bytes.fromhex(hex_digest)).decode()


class Presigner:
    """SigV4 query-string presigning, ~50x faster than botocore's (whose generic request pipeline
    costs ~1.4 ms a URL; a batch of 500 uploads would wait 0.7 s on it). The URL layout (path- or
    virtual-hosted style) is botocore's own, read once from one URL it presigns."""

    def __init__(self, client, session: boto3.session.Session, bucket: str):
        probe = urlsplit(
            client.generate_presigned_url(
                "get_object", Params={"Bucket": bucket, "Key": "__probe__"}, ExpiresIn=60
            )
        )
        self.scheme, self.host = probe.scheme, probe.netloc
        self.path_prefix = probe.path.removesuffix("__probe__")
        self.region, self.session = client.meta.region_name, session
        self._keys: dict[tuple[str, str], bytes] = {}

    def _signing_key(self, secret: str, date: str) -> bytes:
        if (secret, date) not in self._keys:
            key = f"AWS4{secret}".encode()
            for part in (date, self.region, "s3", "aws4_request"):
                key = hmac.new(key, part.encode(), hashlib.sha256).digest()
            self._keys = {(secret, date): key}  # one day's key is all that is ever needed
        return self._keys[(secret, date)]

    def url(
        self,
        method: str,
        key: str,
        *,
        expires: int,
        headers: dict[str, str] | None = None,
        params: dict[str, str] | None = None,
        now: datetime | None = None,
    ) -> str:
        creds = self.session.get_credentials().get_frozen_credentials()
        now = now or datetime.now(UTC)
        amz_date, date = now.strftime("%Y%m%dT%H%M%SZ"), now.strftime("%Y%m%d")
        scope = f"{date}/{self.region}/s3/aws4_request"
        signed = {"host": self.host, **{k.lower(): v.strip() for k, v in (headers or {}).items()}}
        signed_names = ";".join(sorted(signed))
        query = {
            **(params or {}),
            "X-Amz-Algorithm": "AWS4-HMAC-SHA256",
            "X-Amz-Credential": f"{creds.access_key}/{scope}",
            "X-Amz-Date": amz_date,
            "X-Amz-Expires": str(expires),
            "X-Amz-SignedHeaders": signed_names,
        }
        if creds.token:
            query["X-Amz-Security-Token"] = creds.token
        canonical_query = "&".join(
            f"{quote(k, safe='-_.~')}={quote(v, safe='-_.~')}" for k, v in sorted(query.items())
        )
        path = self.path_prefix + quote(key, safe="/~")
        canonical_headers = "".join(f"{name}:{signed[name]}\n" for name in sorted(signed))
        canonical_request = "\n".join(
            [method, path, canonical_query, canonical_headers, signed_names, "UNSIGNED-PAYLOAD"]
        )
        to_sign = "\n".join(
            [
                "AWS4-HMAC-SHA256",
                amz_date,
                scope,
                hashlib.sha256(canonical_request.encode()).hexdigest(),
            ]
        )
        signature = hmac.new(
            self._signing_key(creds.secret_key, date), to_sign.encode(), hashlib.sha256
        ).hexdigest()
        return f"{self.scheme}://{self.host}{path}?{canonical_query}&X-Amz-Signature={signature}"
