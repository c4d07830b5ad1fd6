"""Object-store keys, built here and nowhere else, from typed parts: a workspace, a volume, a job
or a dataset id, and relative paths that pass the volume path rules.

Every customer key lives under `workspaces/<workspace>/` (the platform's own under `platform/`).
A `Prefix` is a folder some caller is entitled to; `ScopedStore` (in this package) refuses any
key outside the prefix it was opened on, so a path that slipped past validation still cannot
climb into another job's or workspace's objects.
"""

import re
import unicodedata
from dataclasses import dataclass
from urllib.parse import unquote

from veri.errors import VeriError
from volumes.stores.base import StoreError

MAX_PATH_BYTES = 900  # the key adds ~100 bytes of prefix; S3 allows 1,024
MAX_SEGMENT_BYTES = 255  # a file name on the local store's filesystem
# Control and format characters (text-direction marks like `evil\u202egnp.exe`, zero-width and
# soft hyphens, byte-order marks) and line or paragraph separators: invisible, or displayed other
# than stored, so refused in paths.
REFUSED_CATEGORIES = {"Cc", "Cf", "Zl", "Zp"}
ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")


class KeyRefused(StoreError, VeriError):
    """A key or path that breaks the rules, or lies outside the caller's prefix: the store's own
    wall, answered as 400 `invalid_path` should validation before it have missed one."""

    def __init__(self, reason: str):
        super().__init__(f"This path is refused: {reason}.", code="invalid_path")


def path_problem(path: object) -> str | None:
    """Why `path` is not a safe relative POSIX path inside a volume or a job, or None.

    Percent-encoded forms are decoded (up to three times) and must pass too, so `%2e%2e/` is
    refused like `../` whatever later decodes it."""
    if not isinstance(path, str) or not path:
        return "it is empty"
    seen = path
    for _ in range(4):
        if problem := _plain_path_problem(seen):
            return problem
        decoded = unquote(seen)
        if decoded == seen:
            return None
        seen = decoded
    return "it is percent-encoded more than three times"


def _plain_path_problem(path: str) -> str | None:
    try:
        size = len(path.encode())
    except UnicodeEncodeError:
        return "it is not valid Unicode (a lone surrogate)"
    if any(unicodedata.category(c) in REFUSED_CATEGORIES for c in path):
        return "it contains a NUL, control, invisible or text-direction character"
    if "\\" in path:
        return "it contains a backslash"
    if path.startswith("/"):
        return "it is absolute"
    segments = path.split("/")
    if any(segment in {"", ".", ".."} for segment in segments):
        return "it has an empty, '.' or '..' segment"
    if size > MAX_PATH_BYTES:
        return f"it is longer than {MAX_PATH_BYTES} bytes"
    if any(len(segment.encode()) > MAX_SEGMENT_BYTES for segment in segments):
        return f"a part of it is longer than {MAX_SEGMENT_BYTES} bytes"
    return None


def check_path(path: str) -> str:
    if problem := path_problem(path):
        raise KeyRefused(f"{path!r} is refused because {problem}")
    return path


def check_key(key: str, *, folder: bool = False) -> str:
    """What both stores do with every key (and listing folder) they are given, whoever the
    caller: a key is a safe relative path from the store's root; a folder may be empty."""
    body = key.removesuffix("/") if folder else key
    if folder and not body:
        return key
    check_path(body)
    return key


def _id(value: str) -> str:
    if not isinstance(value, str) or not ID_RE.fullmatch(value):
        raise KeyRefused(f"{value!r} is not an id")
    return value


@dataclass(frozen=True, slots=True)
class Prefix:
    """A folder of the store; `value` ends with `/`, so `data` never matches `data2`."""

    value: str

    def key(self, path: str) -> str:
        """The key of `path` (a relative path, checked) inside this folder."""
        return self.value + check_path(path)

    def child(self, path: str) -> "Prefix":
        return Prefix(self.key(path) + "/")

    def contains(self, key: str) -> bool:
        return (
            isinstance(key, str)
            and key.startswith(self.value)
            and path_problem(key[len(self.value) :]) is None
        )

    def contains_prefix(self, other: "Prefix") -> bool:
        return other == self or self.contains(other.value.removesuffix("/"))

    def __str__(self) -> str:
        return self.value


ALL_WORKSPACES = Prefix("workspaces/")
# What the platform itself keeps (the worker it serves to rented machines), beside workspaces.
PLATFORM = Prefix("platform/")


def workspace_prefix(workspace_id: str) -> Prefix:
    return Prefix(f"{ALL_WORKSPACES.value}{_id(workspace_id)}/")


def volume_prefix(workspace_id: str, volume_id: str) -> Prefix:
    return Prefix(f"{workspace_prefix(workspace_id).value}volumes/{_id(volume_id)}/")


def job_prefix(workspace_id: str, job_id: str) -> Prefix:
    return Prefix(f"{workspace_prefix(workspace_id).value}jobs/{_id(job_id)}/")


def dataset_prefix(workspace_id: str, dataset_id: str) -> Prefix:
    return Prefix(f"{workspace_prefix(workspace_id).value}datasets/{_id(dataset_id)}/")


def file_prefix(workspace_id: str, file_id: str) -> Prefix:
    """An uploaded file kept as bytes (OpenAI files whose purpose does not train)."""
    return Prefix(f"{workspace_prefix(workspace_id).value}files/{_id(file_id)}/")


def checkpoint_prefix(job: Prefix, *, step: int, final: bool) -> Prefix:
    """Where the worker puts a checkpoint's files: `final/` or `checkpoints/step-00000040/`."""
    if final:
        return job.child("final")
    if not isinstance(step, int) or not 0 <= step < 10**8:
        raise KeyRefused(f"step {step!r} is out of range")
    return job.child(f"checkpoints/step-{step:08d}")


def job_log_key(job: Prefix) -> str:
    return job.key("logs/stdout.txt")
