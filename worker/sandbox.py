"""Where customer code runs: the training process, and with it the reward functions and whatever
the dataset or a volume makes it load.

It gets an allow-listed environment (never the job token, never a provider's or the control
plane's credentials), and its own home as working folder. When the worker runs as root (as on a
rented machine, or the `local` provider run by root), it also runs in a sandbox (bubblewrap): its
own user id, its own process namespace (the runner and its environment are not there to be read,
signalled or traced), and a file system of allow-listed folders only: the system, Python and the
worker package read-only, the job's inputs read-only, its home writable. Nothing of the runner's
(its token, its files) or of the control plane's (its secret key, database, store) is in it.
Every process it started ends with it. Run by another user, the worker cannot separate customer
code from itself: such a machine serves one tenant (the README says so).
"""

import contextlib
import hashlib
import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

import worker

# What training needs from the machine's environment; nothing else of it reaches customer code.
ENV_NAMES = {
    "PATH",
    "LANG",
    "LANGUAGE",
    "TZ",
    "TERM",
    "LD_LIBRARY_PATH",
    "CUDA_VISIBLE_DEVICES",
    "CUDA_DEVICE_ORDER",
    "PYTORCH_CUDA_ALLOC_CONF",
    "HF_HUB_OFFLINE",
    "HF_DATASETS_OFFLINE",
    "TRANSFORMERS_OFFLINE",
    "TOKENIZERS_PARALLELISM",
}
ENV_PREFIXES = ("LC_", "OMP_", "MKL_", "KMP_", "OPENBLAS_", "NCCL_", "NVIDIA_")
# The machine's system folders, read-only in the sandbox; the merged-/usr links among them are
# bound to what they point at.
SYSTEM_DIRS = ("/usr", "/etc", "/bin", "/sbin", "/lib", "/lib64", "/lib32", "/opt")
UID_BASE = 200_000  # training user ids: above any machine's own users, one per job


def isolated() -> bool:
    """Whether customer code runs in the sandbox: only root can build it, and only root needs
    it (a worker run by another user holds nothing another process of that user could not
    read)."""
    return os.geteuid() == 0


def missing_sandbox() -> str | None:
    """Why customer code could not be isolated on this machine, or None."""
    if isolated() and not (shutil.which("bwrap") and shutil.which("setpriv")):
        return (
            "the worker runs as root but bubblewrap (bwrap) or setpriv is not installed, so "
            "customer code cannot be kept away from the runner"
        )
    return None


def training_uid(job_id: str) -> int:
    """The job's own user id (no account on the machine needs to exist for it)."""
    return UID_BASE + int(hashlib.sha256(job_id.encode()).hexdigest()[:6], 16)


def hub_cache() -> Path | None:
    """The machine's Hugging Face model cache, shared read-only with an offline training (the
    `local` provider serves hub ids from it); never the folder above it, which holds tokens."""
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() not in {"1", "true", "yes", "on"}:
        return None
    found = os.environ.get("HF_HUB_CACHE") or (
        f"{os.environ['HF_HOME']}/hub" if os.environ.get("HF_HOME") else None
    )
    cache = Path(found) if found else Path.home() / ".cache" / "huggingface" / "hub"
    return cache if cache.is_dir() else None


def training_env(home: Path, extra: Mapping[str, str]) -> dict[str, str]:
    """The training's environment: the allow-listed names of this machine's, and its own home."""
    env = {k: v for k, v in os.environ.items() if k in ENV_NAMES or k.startswith(ENV_PREFIXES)}
    env |= {
        "HOME": str(home),
        "USER": "veri-training",
        "LOGNAME": "veri-training",
        "TMPDIR": str(home / "tmp"),
        "HF_HOME": str(home / ".cache" / "huggingface"),
        "PYTHONPATH": str(Path(worker.__file__).parent.parent),
        "PYTHONUNBUFFERED": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    if cache := hub_cache():
        env["HF_HUB_CACHE"] = str(cache)
    return env | dict(extra)


def prepare_home(home: Path, uid: int | None) -> None:
    """The training's home (its working folder, output and caches), owned by its user."""
    (home / "tmp").mkdir(parents=True, exist_ok=True)
    if uid is None:
        return
    for folder, _, files in os.walk(home):
        os.chown(folder, uid, uid, follow_symlinks=False)
        for name in files:
            os.chown(os.path.join(folder, name), uid, uid, follow_symlinks=False)
    home.chmod(0o700)


def _packages() -> list[Path]:
    """The folders of the packages customer code may import from Veri: the worker, and the SDK
    (its `@reward_function`), wherever they are installed (a checkout, for an editable install)."""
    found = [Path(worker.__file__).parent]
    sdk = importlib.util.find_spec("veri_sdk")
    if sdk and sdk.origin:
        found.append(Path(sdk.origin).parent)
    return found


def _inside(path: Path, folders: list[Path]) -> bool:
    return any(path == folder or folder in path.parents for folder in folders)


def bwrap_command(
    argv: list[str],
    *,
    uid: int,
    home: Path,
    readable: list[Path],
    cuda: bool,
    network: bool = True,
) -> list[str]:
    """`argv` in the sandbox as `uid`, with `readable` folders read-only and `home` writable;
    without `network`, in its own network namespace (loopback only)."""
    shared = [Path(p) for p in SYSTEM_DIRS if os.path.isdir(p)]
    python = [Path(sys.base_prefix), Path(sys.prefix), *_packages()]
    read_only = sorted(
        {p.resolve() for p in [*python, *readable] if not _inside(p.resolve(), shared)},
        key=lambda p: len(p.parts),
    )
    command = ["bwrap", "--die-with-parent", "--unshare-pid", "--new-session"]
    command += [] if network else ["--unshare-net"]
    for path in shared:
        command += ["--ro-bind", str(path), str(path)]
    command += ["--ro-bind-try", "/sys", "/sys", "--proc", "/proc"]
    # A GPU needs the machine's devices, and ranks share /dev/shm (NCCL); on a CPU, a bare /dev.
    command += ["--dev-bind", "/dev", "/dev"] if cuda else ["--dev", "/dev"]
    command += ["--perms", "1777", "--tmpfs", "/tmp"]
    bound = [*shared, *read_only]
    # The folders above each bound one, made readable by all (bwrap makes them private).
    above = {parent for path in [*read_only, home] for parent in path.parents}
    for folder in sorted(above, key=lambda p: len(p.parts)):
        if folder != Path("/") and not _inside(folder, bound) and folder != Path("/tmp"):
            command += ["--perms", "0755", "--dir", str(folder)]
    for path in read_only:
        command += ["--ro-bind", str(path), str(path)]
    command += ["--bind", str(home), str(home), "--chdir", str(home)]
    # setpriv becomes the training's user inside; every capability goes with root.
    command += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID", "--"]
    command += ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--", *argv]
    return command


def _children() -> dict[int, list[int]]:
    found: dict[int, list[int]] = {}
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                parent = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            found.setdefault(parent, []).append(int(proc.name))
    return found


class Sandboxed(subprocess.Popen):
    """A process started through bwrap: signals go to the program inside (bwrap itself would
    die of them), found as bwrap's grandchild (bwrap → its init in the new namespace → it)."""

    inner: int | None = None

    def _inner_pid(self, wait: float) -> int | None:
        deadline = time.monotonic() + wait
        while self.inner is None and self.poll() is None:
            tree = _children()
            init = tree.get(self.pid, [])
            program = tree.get(init[0], []) if init else []
            if program:
                self.inner = program[0]
            elif time.monotonic() >= deadline:
                break
            else:
                time.sleep(0.05)
        return self.inner

    def send_signal(self, sig: int) -> None:
        if self.poll() is not None:
            return
        inner = self._inner_pid(wait=2.0)
        if inner is None:
            if sig in (signal.SIGKILL, signal.SIGTERM):
                os.kill(self.pid, sig)  # bwrap's end takes everything inside with it
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(inner, sig)


def start(
    argv: list[str],
    *,
    job_id: str,
    home: Path,
    readable: list[Path],
    cuda: bool,
    env: dict[str, str],
    pass_fds: tuple[int, ...] = (),
) -> subprocess.Popen:
    """Start customer code: sandboxed as the job's user when the worker is root; else as a plain
    child (in the machine's process group, which ends with the machine)."""
    options = {
        "stdout": subprocess.PIPE,
        "stderr": subprocess.STDOUT,
        "stdin": subprocess.DEVNULL,
        "env": env,
        "pass_fds": pass_fds,
        "cwd": home,
    }
    if not isolated():
        return subprocess.Popen(argv, **options)
    uid = training_uid(job_id)
    command = bwrap_command(argv, uid=uid, home=home, readable=readable, cuda=cuda)
    return Sandboxed(command, **options)
