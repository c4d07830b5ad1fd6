"""A rented machine runs the worker with nothing but the control plane and the provider's image:
a job's real user-data (from its EC2 launch on moto) runs here in a bare environment (the
system's PATH only, an empty HOME, no project virtualenv, a fresh root folder) and fetches the
installer, the worker built from this very code and its wheelhouse from the live control plane."""

import base64
import hashlib
import json
import subprocess
import time
import zipfile
from pathlib import Path

import pytest
from django.core.management import call_command

from providers import worker_dist
from tests.conftest import fill_volume
from tests.providers.conftest import ec2_client, instances, submit_aws
from tests.training.conftest import upload_dataset, worker_client
from training import tasks
from training.models import JobEvent, TrainingJob
from volumes.stores import get_store
from worker.build import build_id
from worker.runner import registration

pytestmark = pytest.mark.django_db(transaction=True)
SYSTEM_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
SFT_ROWS = [{"text": f"What is {a} plus {b}? It is {a + b}."} for a in range(4) for b in range(4)]


@pytest.fixture
def control_plane(ec2, billed, live_server, settings, local_store_url):
    """The live control plane (API and the local store's signed URLs) that rented machines call
    back, launching on EC2 (moto)."""
    settings.VERI_STORE = local_store_url
    settings.VERI_PUBLIC_URL = live_server.url
    settings.VERI_WORKER_INDEX_URL = ""
    settings.VERI_WORKER_PACKAGE = ""
    return live_server.url


def launch(api_client, workspace, ec2_endpoint, **fields) -> tuple[TrainingJob, str]:
    """Submit an SFT job on the tiny model and launch it on EC2: (the job, its user-data)."""
    fields = {
        "hyperparameters": {"max_steps": 4, "batch_size": 4, "max_seq_length": 64},
        "lora": {"r": 4, "alpha": 8, "dropout": 0.0, "target_modules": ["q_proj", "v_proj"]},
    } | fields
    job = submit_aws(api_client, upload_dataset(api_client, SFT_ROWS), **fields)
    assert tasks.provision_job(job_id=job.pk) == "launched"
    job.refresh_from_db()
    [instance] = instances(ec2_endpoint)
    user_data = ec2_client(ec2_endpoint).describe_instance_attribute(
        InstanceId=instance["InstanceId"], Attribute="userData"
    )["UserData"]["Value"]
    return job, base64.b64decode(user_data).decode()


def boot(tmp_path, script: str, timeout: float = 600, gpu_driver_cuda: str = "") -> tuple:
    """Run the user-data as a machine's first boot would: (exit status, its log, its root).
    With `gpu_driver_cuda`, an `nvidia-smi` reports a driver supporting that CUDA version."""
    root, home = tmp_path / "machine", tmp_path / "home"
    home.mkdir()
    fake_shutdown = tmp_path / "shutdown"
    fake_shutdown.write_text(f'#!/bin/sh\necho "$@" > {tmp_path / "shutdown-called"}\n')
    fake_shutdown.chmod(0o755)
    path = SYSTEM_PATH
    if gpu_driver_cuda:
        (tmp_path / "driver").mkdir()
        smi = tmp_path / "driver" / "nvidia-smi"
        smi.write_text(
            f'#!/bin/sh\necho "| NVIDIA-SMI 550.54.15  CUDA Version: {gpu_driver_cuda} |"\n'
        )
        smi.chmod(0o755)
        path = f"{smi.parent}:{path}"
    env = {
        "PATH": path,
        "HOME": str(home),
        "VERI_ROOT": str(root),
        "VERI_SHUTDOWN": str(fake_shutdown),
        "HF_HUB_OFFLINE": "1",  # this test machine reaches no model hub (the model is a volume's)
    }
    result = subprocess.run(["bash", "-c", script], env=env, timeout=timeout, capture_output=True)
    log = (root / "bootstrap.log").read_text() if (root / "bootstrap.log").exists() else ""
    assert (tmp_path / "shutdown-called").read_text().split() == ["-h", "+10"], log
    return result.returncode, log + result.stderr.decode(), root


@pytest.mark.slow
def test_a_job_launched_on_ec2_runs_from_its_user_data_on_a_bare_machine(
    control_plane, api_client, workspace, ec2_endpoint, tiny_model, tmp_path
):
    fill_volume(
        workspace, "models", {f"tiny/{p.name}": p.read_bytes() for p in tiny_model.iterdir()}
    )
    # What an operator runs once (offline here: pip takes torch's CPU build from this disk).
    call_command("worker_wheelhouse", "--backend", "cpu", "--torch-index-url", "")
    job, script = launch(api_client, workspace, ec2_endpoint, base_model="volume://models/tiny")
    assert job.status == "provisioning"
    # This machine has no GPU: the job trains on the CPU, as a `cpu` job of the local provider.
    TrainingJob.objects.filter(pk=job.pk).update(gpu_type="cpu")

    status, log, root = boot(tmp_path, script)

    assert status == 0, log
    job.refresh_from_db()
    assert job.status == "completed", (job.error_code, job.error_message, log)
    # Installed from the control plane alone: its wheelhouse, no index, no image pip or venv.
    registered = JobEvent.objects.get(job=job, type="configuring").detail["worker"]
    assert registered["build"] == build_id()
    assert registered["bootstrap"]["source"] == "wheelhouse"
    assert registered["bootstrap"]["backend"] == "cpu"
    assert registered["bootstrap"]["install_seconds"] < 120, registered
    assert "uv = " in (root / "venv" / "pyvenv.cfg").read_text()  # made by uv, not the image's
    installed = subprocess.run(
        [root / "venv/bin/python", "-c", "import worker, torch; print(worker.__file__)"],
        capture_output=True,
        text=True,
        check=True,
        cwd=root,
        env={"PATH": SYSTEM_PATH},
    ).stdout
    assert installed.startswith(str(root / "venv"))  # the served wheel, not this checkout
    assert "[veri] worker exited with 0" in log
    # Its last act: the control plane deletes it (with the worker's renewed token).
    assert "[veri] release answered 200" in log
    assert instances(ec2_endpoint)[0]["State"]["Name"] == "terminated"


def test_a_worker_of_another_build_is_refused_at_registration(
    control_plane, api_client, workspace, ec2_endpoint
):
    job, _ = launch(api_client, workspace, ec2_endpoint)
    answer = worker_client(job).post(
        f"/v1/worker/jobs/{job.public_id}/register",
        registration() | {"build": "0123456789abcdef"},
        format="json",
    )
    assert answer.status_code == 409, answer.json()
    assert answer.json()["error"]["code"] == "worker_version_mismatch"
    job.refresh_from_db()
    assert (job.status, job.error_code) == ("failed", "provisioning_error")
    assert f"worker build 0123456789abcdef, not this control plane's {build_id()}" in (
        job.error_message
    )


def test_without_a_wheelhouse_or_an_index_the_bootstrap_fails_fast_as_provisioning_error(
    control_plane, api_client, workspace, ec2_endpoint, tmp_path
):
    """Here the driver supports CUDA 12.4 and the control plane stores only a CPU wheelhouse,
    which a GPU machine must not take."""
    worker_dist.store_folder(worker_dist.wheelhouse_folder("3.11", "cpu"), [])
    job, script = launch(api_client, workspace, ec2_endpoint)
    started = time.monotonic()
    status, log, _ = boot(tmp_path, script, timeout=120, gpu_driver_cuda="12.4")
    assert status == 1 and time.monotonic() - started < 60, log
    job.refresh_from_db()
    assert (job.status, job.error_code) == ("failed", "provisioning_error"), log
    assert "no wheelhouse for this machine (CUDA 12.4)" in job.error_message
    assert "VERI_WORKER_INDEX_URL" in job.error_message
    assert "[veri] release answered 200" in log
    assert instances(ec2_endpoint)[0]["State"]["Name"] == "terminated"


def test_an_unreachable_wheelhouse_falls_back_to_the_configured_index(
    control_plane, api_client, workspace, ec2_endpoint, tmp_path, settings
):
    """The wheelhouse's checksum file names a wheel the store no longer has: the download fails
    and the machine installs from VERI_WORKER_INDEX_URL (here a mirror with a stand-in worker
    package that writes down how it was started)."""
    broken = worker_dist.wheelhouse_folder("3.11", "cpu")
    get_store().put_bytes(
        broken.key(worker_dist.SUMS), f"{'0' * 64}  gone-1.0-py3-none-any.whl\n".encode()
    )
    mirror = tmp_path / "mirror"
    stand_in_worker_index(mirror)
    settings.VERI_WORKER_INDEX_URL = f"file://{mirror}"
    settings.VERI_WORKER_PACKAGE = "veri-stand-in==1.0"
    job, script = launch(api_client, workspace, ec2_endpoint)
    status, log, root = boot(tmp_path, script, timeout=300)
    assert status == 0, log
    assert "the cpu wheelhouse could not be downloaded" in log
    ran = json.loads((root / "work" / "ran.json").read_text())
    assert ran["argv"] == ["run", "--job", job.public_id, "--api", control_plane]
    assert "source=index" in ran["env"]["VERI_BOOTSTRAP"]
    assert ran["env"]["VERI_JOB_TOKEN"].startswith("vjt_")


def stand_in_worker_index(folder: Path) -> None:
    """A PEP 503 index holding `veri-stand-in`, whose `python -m worker run …` writes down its
    arguments and the VERI_ environment it was given."""
    main = (
        "import json, os, sys\n"
        "out = os.path.join(os.environ['VERI_WORK_DIR'], 'ran.json')\n"
        "env = {k: v for k, v in os.environ.items() if k.startswith('VERI_')}\n"
        "json.dump({'argv': sys.argv[1:], 'env': env}, open(out, 'w'))\n"
    )
    wheel(folder, "veri-stand-in", {"worker/__init__.py": "", "worker/__main__.py": main})


def wheel(folder: Path, name: str, files: dict[str, str], entry_points: str = "") -> None:
    """`name` 1.0 as a pure-Python wheel of `files` in a PEP 503 index folder."""
    module = name.replace("-", "_")
    project = folder / name
    project.mkdir(parents=True)
    path = project / f"{module}-1.0-py3-none-any.whl"
    info = f"{module}-1.0.dist-info"
    with zipfile.ZipFile(path, "w") as archive:
        for member, text in files.items():
            archive.writestr(member, text)
        archive.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
        archive.writestr(
            f"{info}/WHEEL",
            "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        )
        if entry_points:
            archive.writestr(f"{info}/entry_points.txt", entry_points)
        archive.writestr(f"{info}/RECORD", "")
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    (project / "index.html").write_text(f'<a href="{path.name}#sha256={digest}">{path.name}</a>')


def test_the_control_plane_picks_the_newest_wheelhouse_the_driver_supports(
    control_plane, api_client, workspace, ec2_endpoint
):
    for backend in ("cpu", "cu121", "cu128"):
        worker_dist.store_folder(worker_dist.wheelhouse_folder("3.11", backend), [])
    job, _ = launch(api_client, workspace, ec2_endpoint)
    worker = worker_client(job)

    def backend_for(cuda: str) -> str:
        answer = worker.get(f"/v1/worker/jobs/{job.public_id}/bootstrap", {"cuda": cuda})
        assert answer.status_code == 200, answer.content
        lines = answer.content.decode().splitlines()
        assert lines[0] == "python 3.11"
        assert [line.split()[1] for line in lines if line.startswith("file ")][:2] == [
            "uv",
            "worker",
        ]
        return lines[1]

    assert backend_for("") == "backend cpu"  # no GPU
    assert backend_for("12.4") == "backend cu121"
    assert backend_for("13.0") == "backend cu128"
    assert backend_for("11.7") == "backend none"  # older than every stored build
    refused = worker.get(f"/v1/worker/jobs/{job.public_id}/bootstrap", {"cuda": "12.4; rm"})
    assert refused.status_code == 400 and refused.json()["error"]["field"] == "cuda"
