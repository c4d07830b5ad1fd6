"""Object stores behind one small interface: `S3Store` (any S3 API) and `LocalStore` (a folder).

Keys are relative to the store's root prefix and built only in `keys`. Callers open the store on
the prefix they are entitled to (`store_for`), which refuses keys outside it. Presigned URLs let
clients move bytes without the control plane in the path; `LocalStore`'s are HMAC-signed URLs
that the control plane serves.
"""

from functools import cache
from urllib.parse import urlsplit

from django.conf import settings

from volumes.stores import keys
from volumes.stores.base import (
    BadDigest,
    ObjectExists,
    ObjectStore,
    StoredObject,
    StoreError,
    StoreUnavailable,
)
from volumes.stores.keys import KeyRefused, Prefix
from volumes.stores.local import LocalStore
from volumes.stores.s3 import S3Store
from volumes.stores.scoped import ScopedStore

__all__ = [
    "BadDigest",
    "KeyRefused",
    "LocalStore",
    "ObjectExists",
    "ObjectStore",
    "Prefix",
    "S3Store",
    "ScopedStore",
    "StoreError",
    "StoreUnavailable",
    "StoredObject",
    "get_store",
    "keys",
    "store_for",
    "store_from_url",
]


def store_from_url(url: str, *, endpoint_url: str | None = None, public_url: str) -> ObjectStore:
    """`public_url`: where this deployment's API is reached, which serves the local store's
    signed URLs (S3's point at S3)."""
    parts = urlsplit(url)
    if parts.scheme == "s3":
        return S3Store(parts.netloc, parts.path, endpoint_url=endpoint_url)
    if parts.scheme == "file":
        return LocalStore(parts.path, base_url=public_url)
    raise ValueError(f"VERI_STORE must be file:///path or s3://bucket/prefix, not {url!r}")


@cache
def _store_for(url: str, endpoint_url: str | None, public_url: str) -> ObjectStore:
    return store_from_url(url, endpoint_url=endpoint_url, public_url=public_url)


def get_store() -> ObjectStore:
    """The configured store; built on first use (not at import) and kept per setting value."""
    return _store_for(settings.VERI_STORE, settings.AWS_ENDPOINT_URL, settings.VERI_PUBLIC_URL)


def store_for(scope: Prefix) -> ScopedStore:
    """The configured store, limited to `scope`: every key handed to it must lie inside."""
    return ScopedStore(get_store(), scope)
