"""The `local` provider: each "instance" is a host process on this machine (see local_host.py)
running the worker. Instance ids are `<pid>:<start time>`, so a reused pid is never mistaken for
the instance."""

import json
import os
import signal
import subprocess
import sys
import threading
from datetime import timedelta
from pathlib import Path

import httpx
from django.conf import settings
from django.utils import timezone

from providers.base import ControlPlaneUnreachable, InstanceState, LaunchSpec, ProviderAdapter
from providers.catalog import local_provider
from providers.models import Instance
from veri.services import deployment_id
from veri.tls import tls_context
from worker import sandbox

HOST_SCRIPT = Path(__file__).resolve().with_name("local_host.py")
# local_host.py's names for the simulated preemption: the notice it watches for in its folder,
# and where it marks a machine it took away itself.
NOTICE_FILE = "preemption-notice.json"
RECLAIMED_DIR = ".reclaimed"


# What a local worker gets of this machine's environment, as a worker on a rented box has its
# box's: paths, locale, thread and device settings, the model cache, its own options. Nothing
# else: the control plane's settings and every credential (a provider's token, Stripe's key, the
# database's URL) stay here.
WORKER_ENV_NAMES = {
    "PATH",
    "HOME",
    "LANG",
    "LANGUAGE",
    "TZ",
    "TERM",
    "TMPDIR",
    "PYTHONPATH",
    "LD_LIBRARY_PATH",
    "CUDA_VISIBLE_DEVICES",
    "CUDA_DEVICE_ORDER",
    "HF_HOME",
    "HF_HUB_CACHE",
    "TOKENIZERS_PARALLELISM",
}
WORKER_ENV_PREFIXES = ("LC_", "OMP_", "MKL_", "KMP_", "OPENBLAS_", "NCCL_", "VERI_WORKER_")


def worker_env() -> dict[str, str]:
    return {
        k: v
        for k, v in os.environ.items()
        if k in WORKER_ENV_NAMES or k.startswith(WORKER_ENV_PREFIXES)
    }


def isolation() -> str:
    """How this machine keeps customer code from the worker and the control plane (what
    `/healthz` reports): `sandbox` when the platform runs as root and bubblewrap is installed
    (see worker.sandbox), else `none` (one tenant only)."""
    return "none" if not sandbox.isolated() or sandbox.missing_sandbox() else "sandbox"


def _check_control_plane(api_url: str) -> None:
    """The worker calls back `api_url`: a launch that it could not reach is refused now, rather
    than a job left waiting for a registration that never comes."""
    hint = (
        f"Local workers call the API server back at VERI_PUBLIC_URL={api_url}, which "
        "{problem}. Start the server there, or set VERI_PUBLIC_URL to the URL it listens on "
        "(for both the server and the qcluster)."
    )
    try:
        answer = httpx.get(f"{api_url.rstrip('/')}/healthz", timeout=5, verify=tls_context())
        body = answer.json()
    except httpx.HTTPError as exc:
        raise ControlPlaneUnreachable(hint.format(problem=f"did not answer ({exc})")) from exc
    except ValueError:
        body = None
    if not isinstance(body, dict) or "database" not in body:
        raise ControlPlaneUnreachable(
            hint.format(problem=f"answered HTTP {answer.status_code} but is not a Veri API")
        )
    if body.get("deployment") != deployment_id():
        raise ControlPlaneUnreachable(
            hint.format(problem="is another Veri deployment (its SECRET_KEY differs from ours)")
        )


def _in_hub_cache(repo_id: str) -> bool:
    """Whether the Hugging Face cache holds a snapshot of `repo_id` with its config."""
    folder = Path(settings.VERI_LOCAL_HF_CACHE) / f"models--{repo_id.replace('/', '--')}"
    return any((folder / "snapshots").glob("*/config.json"))


def _start_time(pid: int) -> str | None:
    """The process's start time (clock ticks since boot), or None when it is gone or a zombie."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return None if fields[0] == "Z" else fields[19]


class LocalProvider(ProviderAdapter):
    name = "local"
    availability_ttl_seconds = 0  # free slots change with every job; counting them is cheap
    serves_replicas = True  # on this machine's loopback, beside the router

    def is_configured(self) -> bool:
        return True

    def max_instances(self) -> int:
        return settings.VERI_LOCAL_SLOTS

    def available_regions(self, gpu_type: str) -> list[str]:
        """This machine runs jobs in any region while a slot is free."""
        busy = Instance.objects.filter(provider="local", terminated_at__isnull=True).count()
        if busy >= self.max_instances() or local_provider().gpu(gpu_type) is None:
            return []
        return list(local_provider().zones)

    def model_problem(self, base_model: str) -> str | None:
        """A hub id must already be in this machine's model cache when workers are offline
        (HF_HUB_OFFLINE, the embedded default)."""
        if not settings.VERI_LOCAL_HUB_OFFLINE or _in_hub_cache(base_model):
            return None
        return (
            f"base_model {base_model!r} is a model hub id, and workers on this deployment are "
            "offline (the default here; the server started with HF_HUB_OFFLINE=0 lets them "
            f"download) and do not find it in the local cache ({settings.VERI_LOCAL_HF_CACHE}). "
            "Upload the model's folder into a volume "
            "(veri volumes upload-dir VOLUME ./model --prefix models/NAME) and submit "
            "base_model='volume://VOLUME/models/NAME'."
        )

    def instance_dir(self, job_id: str) -> Path:
        return Path(settings.VERI_LOCAL_INSTANCES_DIR) / job_id

    def preemption_notice(self, job_id: str) -> str:
        return f"file:{(self.instance_dir(job_id) / NOTICE_FILE).resolve()}"

    def simulate_preemption(self, job_id: str, *, seconds: float) -> None:
        """Warn the job's machine, as a spot market would, that it is taken away in `seconds`;
        then its host ends it, and the instance reads as reclaimed."""
        notice = self.instance_dir(job_id) / NOTICE_FILE
        when = timezone.now() + timedelta(seconds=seconds)
        staged = notice.with_suffix(".tmp")
        staged.write_text(json.dumps({"terminates_at": when.isoformat()}))
        staged.replace(notice)  # whole, never half-written, to the worker and the host

    def launch(self, spec: LaunchSpec) -> str:
        _check_control_plane(spec.api_url)
        folder = self.instance_dir(spec.job_id)
        (folder / "mnt").mkdir(parents=True, exist_ok=True)
        (folder / NOTICE_FILE).unlink(missing_ok=True)  # an earlier run's, not this machine's
        command = [*settings.VERI_LOCAL_WORKER_COMMAND, *spec.worker_command()]
        env = {
            # The machine's own environment (BLAS and thread settings, PATH, HOME), as a worker on
            # a rented box has its box's, less the control plane's credentials and settings.
            **worker_env(),
            "HF_HUB_OFFLINE": "1" if settings.VERI_LOCAL_HUB_OFFLINE else "0",
            "VERI_MOUNT_ROOT": str(folder / "mnt"),
            "VERI_WORK_DIR": str(folder / "work"),
            **spec.env,
        }
        if spec.gpu_type == "cpu":
            env["CUDA_VISIBLE_DEVICES"] = ""
        host = subprocess.Popen(
            [
                sys.executable,
                str(HOST_SCRIPT),
                str(folder.resolve() / "worker.log"),
                "--",
                *command,
            ],
            env=env,
            cwd=folder,  # its own folder: relative paths in customer code reach nothing else
            start_new_session=True,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        (self._reclaimed_dir() / str(host.pid)).unlink(missing_ok=True)  # a reused pid's
        # Reaped by this process (its parent) the moment it ends, however it ends: killed by a
        # cancel in another task worker, a simulated preemption, a test. Else it stays a zombie
        # until this task worker exits.
        threading.Thread(target=host.wait, name=f"reap-{host.pid}", daemon=True).start()
        return f"{host.pid}:{_start_time(host.pid)}"

    def replica_address(self, instance_id: str) -> str:
        """A local replica serves on this machine's loopback, where the router runs."""
        return "127.0.0.1"

    def _reclaimed_dir(self) -> Path:
        return Path(settings.VERI_LOCAL_INSTANCES_DIR) / RECLAIMED_DIR

    def states(self, instance_ids: list[str]) -> dict[str, InstanceState]:
        found = {}
        for iid in instance_ids:
            alive = self._alive(iid)
            taken = not alive and (self._reclaimed_dir() / iid.split(":")[0]).exists()
            found[iid] = InstanceState(alive=alive, reason="reclaimed" if taken else None)
        return found

    def terminate(self, instance_id: str) -> None:
        if not self._alive(instance_id):
            return
        pid = int(instance_id.split(":")[0])
        try:
            os.killpg(pid, signal.SIGKILL)
            os.waitpid(pid, 0)  # reap it when this process launched it, so no zombie is left
        except (ProcessLookupError, ChildProcessError):
            pass

    def tagged_instances(self) -> dict[str, str]:
        """The host processes running under this deployment's instances folder, each with the
        job whose folder it runs in: what this "provider" knows of its machines, so a launch
        whose task died after starting one is found, and an orphan swept."""
        root = Path(settings.VERI_LOCAL_INSTANCES_DIR).resolve()
        found = {}
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                argv = (proc / "cmdline").read_bytes().split(b"\0")
            except OSError:  # gone meanwhile, or not ours to read
                continue
            if len(argv) < 3 or os.fsdecode(argv[1]) != str(HOST_SCRIPT):
                continue
            log = Path(os.fsdecode(argv[2]))
            if log.parent.parent == root and (started := _start_time(int(proc.name))):
                found[f"{proc.name}:{started}"] = log.parent.name
        return found

    @staticmethod
    def _alive(instance_id: str) -> bool:
        pid, _, started = instance_id.partition(":")
        return _start_time(int(pid)) == started
