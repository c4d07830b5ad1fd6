"""Which worker this is: a digest of the code a rented machine runs (the `worker` and `veri_sdk`
packages). The control plane computes it over its own copy and refuses a worker whose digest
differs at registration, so a machine never runs another version's protocol or checks."""

import hashlib
from functools import cache
from importlib.util import find_spec
from pathlib import Path

PACKAGES = ("worker", "veri_sdk")


def package_root(package: str) -> Path:
    return Path(find_spec(package).origin).parent


def source_files() -> list[tuple[str, Path]]:
    """(path inside the wheel, file) for every module of the worker's packages, sorted."""
    found = []
    for package in PACKAGES:
        root = package_root(package)
        found += [
            (f"{package}/{path.relative_to(root).as_posix()}", path)
            for path in root.rglob("*.py")
            if "__pycache__" not in path.parts
        ]
    return sorted(found)


@cache
def build_id() -> str:
    """16 hex digits of SHA-256 over each module's path and bytes."""
    digest = hashlib.sha256()
    for name, path in source_files():
        digest.update(name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]
