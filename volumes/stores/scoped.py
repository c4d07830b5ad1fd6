"""`ScopedStore`: a store opened on one prefix, the second wall behind path validation.

Callers never hold the whole store: a job's worker endpoints open it on the job's folder, a volume's
uploads on the volume's, the reconciler on `workspaces/`. A key outside that folder (or one that
breaks the path rules inside it) is refused here, on either store, before any URL is signed or any
byte is read or written.
"""

from collections.abc import Iterable, Iterator

from volumes.stores.base import MultipartInProgress, ObjectStore, StoredObject, range_header
from volumes.stores.keys import KeyRefused, Prefix


class ScopedStore:
    def __init__(self, store: ObjectStore, scope: Prefix):
        self.store, self.scope = store, scope

    def _key(self, key: str) -> str:
        if not self.scope.contains(key):
            raise KeyRefused(f"the key {key!r} is outside {self.scope.value}")
        return key

    def _prefix(self, prefix: Prefix) -> str:
        if not self.scope.contains_prefix(prefix):
            raise KeyRefused(f"the folder {prefix.value!r} is outside {self.scope.value}")
        return prefix.value

    def presign_put(
        self, key: str, *, expires: int, sha256: str | None = None, create_only: bool = False
    ) -> tuple[str, dict[str, str]]:
        return self.store.presign_put(
            self._key(key), expires=expires, sha256=sha256, create_only=create_only
        )

    def presign_get(self, key: str, *, expires: int) -> str:
        return self.store.presign_get(self._key(key), expires=expires)

    def signed_get(
        self, key: str, *, expires: int, byte_range: tuple[int, int] | None = None
    ) -> dict:
        """Where a client GETs the object, or its `byte_range` (a pack's file): `{"url"}`, and
        the `headers` to send with it when there are any."""
        answer = {"url": self.presign_get(key, expires=expires)}
        if byte_range:
            answer["headers"] = range_header(byte_range)
        return answer

    def create_multipart(self, key: str) -> str:
        return self.store.create_multipart(self._key(key))

    def presign_part(self, key: str, *, upload_id: str, number: int, expires: int) -> str:
        return self.store.presign_part(
            self._key(key), upload_id=upload_id, number=number, expires=expires
        )

    def complete_multipart(self, key: str, *, upload_id: str, parts: list[tuple[int, str]]) -> None:
        self.store.complete_multipart(self._key(key), upload_id=upload_id, parts=parts)

    def abort_multipart(self, key: str, *, upload_id: str) -> None:
        self.store.abort_multipart(self._key(key), upload_id=upload_id)

    def list_multipart(self, prefix: Prefix) -> list[MultipartInProgress]:
        return self.store.list_multipart(self._prefix(prefix))

    def head(self, key: str) -> StoredObject | None:
        return self.store.head(self._key(key))

    def stat_many(self, keys: list[str]) -> dict[str, StoredObject]:
        return self.store.stat_many([self._key(key) for key in keys])

    def iter_objects(self, prefix: Prefix) -> Iterator[StoredObject]:
        return self.store.iter_objects(self._prefix(prefix))

    def get_bytes(self, key: str, *, byte_range: tuple[int, int] | None = None) -> bytes:
        return self.store.get_bytes(self._key(key), byte_range=byte_range)

    def put_bytes(self, key: str, data: bytes) -> None:
        self.store.put_bytes(self._key(key), data)

    def put_stream(self, key: str, chunks: Iterable[bytes]) -> int:
        return self.store.put_stream(self._key(key), chunks)

    def iter_bytes(self, key: str, *, byte_range: tuple[int, int] | None = None) -> Iterator[bytes]:
        return self.store.iter_bytes(self._key(key), byte_range=byte_range)

    def delete(self, keys: Iterable[str]) -> None:
        self.store.delete([self._key(key) for key in keys])

    def delete_prefix(self, prefix: Prefix) -> int:
        return self.store.delete_prefix(self._prefix(prefix))

    def read_grant(self, prefix: Prefix, keys: list[str], *, ttl: int) -> tuple[dict, dict]:
        """Short-lived read-only access to `keys`, all inside `prefix` (see the store's own)."""
        folder = Prefix(self._prefix(prefix))
        for key in keys:
            if not folder.contains(key):
                raise KeyRefused(f"the key {key!r} is outside {folder.value}")
        return self.store.read_grant(folder.value, keys, ttl=ttl)
