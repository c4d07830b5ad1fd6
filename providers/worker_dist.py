"""What a rented machine installs, served by this control plane from its object store: a wheel of
exactly the running worker code (`veri-worker`, built here once per build id), the `uv` installer
this control plane runs with, and wheelhouses of the worker's pinned dependencies, one per Python
and torch backend (`manage.py worker_wheelhouse`). The bootstrap asks for a manifest of signed
URLs (`manifest`), so a machine needs neither the public package index nor a published Veri."""

import hashlib
import io
import logging
import re
import subprocess
import sys
import tempfile
import zipfile
from base64 import urlsafe_b64encode
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, requires, version
from pathlib import Path
from platform import machine

from django.conf import settings
from packaging.requirements import Requirement

from volumes.stores import keys, store_for
from worker.build import build_id, source_files

log = logging.getLogger(__name__)
SUMS = "SHA256SUMS"
# Torch's CUDA builds, by the CUDA version they need of the driver; "cpu" for none.
BACKENDS = ("cpu", "cu118", "cu121", "cu124", "cu126", "cu128", "cu130")
CUDA_BUILDS = {b: (int(b[2:-1]), int(b[-1])) for b in BACKENDS[1:]}  # "cu124" → (12, 4), in order
TORCH_INDEX_URL = "https://download.pytorch.org/whl"
# The machines Veri rents: x86-64 Linux with glibc 2.28 or newer (every provider's image).
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")
ZIP_DATE = (1980, 1, 1, 0, 0, 0)  # fixed: the same code gives the same bytes, whoever builds it


@dataclass(frozen=True, slots=True)
class DistFile:
    kind: str  # "uv", "worker" or "wheel"
    name: str
    sha256: str
    key: str


def store():
    return store_for(keys.PLATFORM)


def _folder(*parts: str) -> keys.Prefix:
    return keys.PLATFORM.child("/".join(parts))


def worker_requirements() -> list[str]:
    """The `worker` extra of the installed `veri` distribution, without its marker."""
    try:
        listed = requires("veri") or []
    except PackageNotFoundError:
        raise RuntimeError("install Veri (pip install -e .) to serve its worker") from None
    found = []
    for line in listed:
        requirement = Requirement(line)
        if requirement.marker and requirement.marker.evaluate({"extra": "worker"}):
            requirement.marker = None
            found.append(str(requirement))
    return found


def worker_version() -> str:
    """`veri`'s version with the build id as its local label: `0.1.0+3fa2…`."""
    try:
        base = version("veri").partition("+")[0]
    except PackageNotFoundError:
        base = "0"
    return f"{base}+{build_id()}"


def worker_wheel_bytes() -> tuple[str, bytes]:
    """(file name, bytes) of the `veri-worker` wheel of the running code. Written by hand rather
    than with `wheel.wheelfile`, which stamps the time: two processes building at once must
    store the same bytes under the one name the checksum file vouches for."""
    name, wheel_version = "veri_worker", worker_version()
    info = f"{name}-{wheel_version}.dist-info"
    members = [(path, file.read_bytes()) for path, file in source_files()]
    metadata = [
        "Metadata-Version: 2.1",
        "Name: veri-worker",
        f"Version: {wheel_version}",
        "Summary: The Veri worker, as this control plane serves it to rented machines",
        "Requires-Python: >=3.11",
        *(f"Requires-Dist: {r}" for r in worker_requirements()),
    ]
    members += [
        (f"{info}/METADATA", ("\n".join(metadata) + "\n").encode()),
        (
            f"{info}/WHEEL",
            b"Wheel-Version: 1.0\nGenerator: veri\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        ),
    ]
    record = []
    for path, data in members:
        digest = urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(data)}")
    members.append((f"{info}/RECORD", ("\n".join([*record, f"{info}/RECORD,,"]) + "\n").encode()))
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for path, data in members:
            entry = zipfile.ZipInfo(path, date_time=ZIP_DATE)
            entry.external_attr = 0o644 << 16
            entry.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(entry, data)
    return f"{name}-{wheel_version}-py3-none-any.whl", buffer.getvalue()


def _read_sums(folder: keys.Prefix) -> dict[str, str] | None:
    """name → sha256 from a folder's checksum file, written last: None while it is incomplete."""
    scoped = store()
    if scoped.head(folder.key(SUMS)) is None:
        return None
    lines = scoped.get_bytes(folder.key(SUMS)).decode().splitlines()
    return {name: digest for digest, _, name in (line.partition("  ") for line in lines if line)}


def store_folder(folder: keys.Prefix, files: list[tuple[str, Path | bytes]]) -> dict[str, str]:
    """Store each file in `folder`, then the checksum file that makes the folder complete."""
    scoped, sums = store(), {}
    for name, content in files:
        if isinstance(content, bytes):
            sums[name] = hashlib.sha256(content).hexdigest()
            scoped.put_bytes(folder.key(name), content)
            continue
        with content.open("rb") as handle:
            sums[name] = hashlib.file_digest(handle, "sha256").hexdigest()
            handle.seek(0)
            scoped.put_stream(folder.key(name), iter(lambda h=handle: h.read(8 << 20), b""))
    scoped.put_bytes(folder.key(SUMS), "".join(f"{d}  {n}\n" for n, d in sums.items()).encode())
    return sums


def _files(kind: str, folder: keys.Prefix, sums: dict[str, str]) -> list[DistFile]:
    return [DistFile(kind, name, digest, folder.key(name)) for name, digest in sorted(sums.items())]


def worker_files() -> list[DistFile]:
    """The worker wheel of the running code and the `uv` binary, stored on first use. The uv
    served is the one this control plane was installed with, whose binary runs where the control
    plane runs: it is served only from x86-64 Linux, the machines Veri rents (elsewhere the
    manifest has no installer, and a machine's bootstrap fails saying so)."""
    worker = _folder("worker", build_id())
    sums = _read_sums(worker)
    if sums is None:
        sums = store_folder(worker, [worker_wheel_bytes()])
    if (sys.platform, machine()) != ("linux", "x86_64"):
        log.warning("no uv to serve rented machines: this control plane is not x86-64 Linux")
        return _files("worker", worker, sums)
    import uv

    installer = _folder("uv", version("uv"), "linux-x86_64")
    uv_sums = _read_sums(installer) or store_folder(installer, [("uv", Path(uv.find_uv_bin()))])
    return _files("uv", installer, uv_sums) + _files("worker", worker, sums)


def wheelhouse_folder(python: str, backend: str) -> keys.Prefix:
    return _folder("wheelhouse", f"py{python}", backend)


def wheelhouse(python: str, backend: str) -> list[DistFile] | None:
    """The stored wheelhouse for this Python and torch backend; None when none is complete."""
    folder = wheelhouse_folder(python, backend)
    sums = _read_sums(folder)
    return None if sums is None else _files("wheel", folder, sums)


def backend_for(cuda: str) -> list[str]:
    """Torch backends a machine can use, best first: those whose CUDA version its driver
    supports (`cuda` as `nvidia-smi` prints it, e.g. "12.4"), or ["cpu"] without a GPU."""
    match = re.fullmatch(r"(\d+)\.(\d+)", cuda or "")
    if not match:
        return ["cpu"]
    driver = (int(match[1]), int(match[2]))
    return [b for b, needs in reversed(CUDA_BUILDS.items()) if needs <= driver]


def pip_download_command(*, python: str, backend: str, torch_index_url: str | None) -> list[str]:
    """pip downloading wheels for rented machines: this Python, x86-64 Linux, torch built for
    `backend` from `torch_index_url`, PyTorch's wheel index root (None: pip's configuration)."""
    command = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--quiet",
        "--only-binary=:all:",
        "--retries=2",  # an index that cannot be reached fails in a minute, not in an hour
        "--timeout=30",
        "--implementation=cp",
        f"--python-version={python}",
        *(f"--platform={p}" for p in PLATFORMS),
    ]
    if torch_index_url:
        command.append(f"--extra-index-url={torch_index_url.rstrip('/')}/{backend}")
    return command


def fill_wheelhouse(*, python: str, backend: str, torch_index_url: str | None) -> list[DistFile]:
    """Download the worker's pinned dependencies (`pip_download_command`) and store them as the
    wheelhouse machines with this Python and torch backend install from."""
    command = pip_download_command(python=python, backend=backend, torch_index_url=torch_index_url)
    with tempfile.TemporaryDirectory() as folder:
        subprocess.run([*command, "--dest", folder, *worker_requirements()], check=True)
        wheels = sorted(Path(folder).glob("*.whl"))
        sums = store_folder(wheelhouse_folder(python, backend), [(w.name, w) for w in wheels])
    return _files("wheel", wheelhouse_folder(python, backend), sums)


def manifest(*, cuda: str, expires: int) -> str:
    """The bootstrap's instructions, one per line (`kind value…`), URLs signed for `expires`:
    `python`, `backend`, optionally `index` and `package` (the operator's mirror overrides), then
    `file KIND SHA256 NAME URL` for the installer, the worker and the wheelhouse."""
    python = settings.VERI_WORKER_PYTHON
    lines = [f"python {python}"]
    backends = backend_for(cuda)
    chosen = next(((b, f) for b in backends if (f := wheelhouse(python, b)) is not None), None)
    lines.append(f"backend {chosen[0] if chosen else 'none'}")
    if settings.VERI_WORKER_INDEX_URL:
        lines.append(f"index {settings.VERI_WORKER_INDEX_URL}")
    if settings.VERI_WORKER_PACKAGE:
        lines.append(f"package {settings.VERI_WORKER_PACKAGE}")
    scoped = store()
    for file in worker_files() + (chosen[1] if chosen else []):
        url = scoped.presign_get(file.key, expires=expires)
        lines.append(f"file {file.kind} {file.sha256} {file.name} {url}")
    return "\n".join(lines) + "\n"
