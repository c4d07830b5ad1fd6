"""A deployment on a cloud provider: its replica's machine is rented through the provider (against
each provider's fake, as jobs' launches are) and booted with the worker's bootstrap, which
installs the pinned vLLM and starts the replica's serving process on vLLM with a LoRA slot for
each adapter and a tensor-parallel rank per GPU."""

import base64
import json
import shlex
import subprocess
from pathlib import Path

import pytest

from serving import tasks
from serving.models import Replica
from serving.services import replicas
from tests.conftest import fill_volume
from tests.providers.conftest import ec2_client, instances, submit_aws
from tests.providers.test_bootstrap import boot, wheel
from tests.training.conftest import upload_dataset
from training import tasks as training_tasks
from training.models import Checkpoint, TrainingJob

pytestmark = pytest.mark.django_db
BASE = "volume://models/tiny"


def aws_script(fake, request) -> str:
    ec2_endpoint = request.getfixturevalue("ec2_endpoint")
    [instance] = instances(ec2_endpoint)
    user_data = ec2_client(ec2_endpoint).describe_instance_attribute(
        InstanceId=instance["InstanceId"], Attribute="userData"
    )["UserData"]["Value"]
    return base64.b64decode(user_data).decode()


def digitalocean_script(fake, request) -> str:
    [body] = fake.calls("POST", "/v2/droplets")
    return body["user_data"]


# (provider, its fake's fixture, gpu_type, gpu_count, the rendered script as the provider got it):
# the providers that serve replicas (test_serving_routes.py: the others refuse deployments).
PROVIDERS = [
    ("aws", "ec2", "L4-24GB", 4, aws_script),
    ("digitalocean", "digitalocean", "H100-80GB", 8, digitalocean_script),
]


@pytest.fixture
def adapters(api_client, billed, settings, local_store_url) -> list[str]:
    """Two checkpoints of a job on BASE, deployable as adapters."""
    settings.VERI_STORE = local_store_url
    fill_volume(billed, "models", {"tiny/config.json": b"{}"})
    dataset = upload_dataset(api_client, [{"text": f"row {i}"} for i in range(4)])
    created = api_client.post(
        "/v1/training_jobs",
        {"base_model": BASE, "dataset_id": dataset["id"], "method": "sft_text"},
        format="json",
    )
    assert created.status_code == 201, created.json()
    job = TrainingJob.objects.get(public_id=created.json()["id"])
    return [
        Checkpoint.objects.create(workspace=job.workspace, job=job, step=step).public_id
        for step in (2, 4)
    ]


@pytest.mark.parametrize(("provider", "fixture", "gpu_type", "gpu_count", "script_of"), PROVIDERS)
def test_a_deployment_on_a_cloud_provider_boots_its_replica_on_vllm_with_lora(
    request, api_client, adapters, settings, provider, fixture, gpu_type, gpu_count,
    script_of,
):  # fmt: skip
    fake = request.getfixturevalue(fixture)
    created = api_client.post(
        "/v1/deployments",
        {
            "adapters": adapters,
            "provider": provider,
            "gpu_type": gpu_type,
            "gpu_count": gpu_count,
            "region": "us-east-1",
        },
        format="json",
    )
    assert created.status_code == 201, created.json()
    replica = Replica.objects.get(deployment__public_id=created.json()["id"])
    assert tasks.launch_replica(replica_id=replica.pk) == "launched"

    script = script_of(fake, request)
    serve = shlex.join(
        [
            "-m",
            "worker",
            "serve",
            "--replica",
            replica.public_id,
            "--api",
            settings.VERI_PUBLIC_URL,
            "--engine",
            "vllm",
            "--tensor-parallel-size",
            str(gpu_count),
            "--max-loras",
            "2",
        ]
    )
    assert f'"$root/venv/bin/python" {serve} ||' in script
    # The pinned vLLM, in its own virtualenv, its `vllm` on the serving process's PATH.
    assert f"engine={settings.VERI_VLLM_REQUIREMENT}\n" in script
    install = '--torch-backend auto \\\n  --index-url "${index:-https://pypi.org/simple}" "$engine"'
    assert install in script
    assert 'export PATH="$root/engine/bin:$PATH"' in script
    # The replica's own routes and token, never a job's.
    assert f"\njob={replica.public_id}\n" in script
    assert 'routes="$api/v1/worker/replicas/$job"' in script
    assert "\nVERI_REPLICA_TOKEN=veri_rt_" in script and "VERI_JOB_TOKEN" not in script
    assert f"\nVERI_SERVING_KEY={replicas.serving_key(replica=replica)}\n" in script
    assert api_client.raw_key not in script
    assert subprocess.run(["bash", "-n"], input=script.encode()).returncode == 0


def test_a_job_still_boots_the_training_worker_without_vllm(
    request, api_client, ec2, billed, settings, local_store_url
):
    settings.VERI_STORE = local_store_url
    dataset = upload_dataset(api_client, [{"text": "row"}])
    job = submit_aws(api_client, dataset)
    assert training_tasks.provision_job(job_id=job.pk) == "launched"
    script = aws_script(ec2, request)
    assert f"-m worker run --job {job.public_id} --api " in script
    assert 'routes="$api/v1/worker/jobs/$job"' in script and "engine=" not in script


@pytest.mark.django_db(transaction=True)
def test_a_replica_machine_whose_bootstrap_fails_ends_as_provisioning_error_unbilled(
    request, api_client, adapters, ec2, live_server, settings, tmp_path
):
    """The rendered bootstrap, run as a machine's first boot: the control plane stores no
    wheelhouse and names no index, so it fails at once and says so with the replica's token."""
    settings.VERI_PUBLIC_URL = live_server.url
    settings.VERI_WORKER_INDEX_URL = ""
    settings.VERI_WORKER_PACKAGE = ""
    created = api_client.post(
        "/v1/deployments",
        {"adapters": adapters, "provider": "aws", "gpu_type": "L4-24GB", "region": "us-east-1"},
        format="json",
    )
    assert created.status_code == 201, created.json()
    replica = Replica.objects.get(deployment__public_id=created.json()["id"])
    assert tasks.launch_replica(replica_id=replica.pk) == "launched"

    status, log, _ = boot(tmp_path, aws_script(ec2, request), timeout=120)

    assert status == 1, log
    replica.refresh_from_db()
    assert (replica.status, replica.error_code) == ("failed", "provisioning_error"), log
    assert "no wheelhouse for this machine" in replica.error_message
    deployment = api_client.get(f"/v1/deployments/{created.json()['id']}").json()
    assert deployment["status"] == "failed"
    assert deployment["error"]["attribution"] == "platform"
    [instance] = instances(request.getfixturevalue("ec2_endpoint"))
    assert instance["State"]["Name"] == "terminated"  # terminate-always, by the control plane
    assert replica.charged_until is None and replica.ready_at is None  # nothing billed


def stand_in_index(folder: Path) -> None:
    """A PEP 503 index with `veri-stand-in` (its `python -m worker …` writes down its arguments,
    its VERI_ environment and the `vllm` it finds on PATH) and `vllm-stand-in` (a `vllm`
    executable), standing in for the worker and vLLM."""
    main = (
        "import json, os, shutil, sys\n"
        "out = os.path.join(os.environ['VERI_WORK_DIR'], 'ran.json')\n"
        "env = {k: v for k, v in os.environ.items() if k.startswith('VERI_')}\n"
        "found = {'argv': sys.argv[1:], 'env': env, 'vllm': shutil.which('vllm')}\n"
        "json.dump(found, open(out, 'w'))\n"
    )
    wheel(folder, "veri-stand-in", {"worker/__init__.py": "", "worker/__main__.py": main})
    wheel(
        folder,
        "vllm-stand-in",
        {"vllm_stand_in.py": "def main():\n    print('stand-in')\n"},
        entry_points="[console_scripts]\nvllm = vllm_stand_in:main\n",
    )


@pytest.mark.django_db(transaction=True)
def test_a_replica_machine_installs_vllm_beside_the_worker_and_starts_it_serving(
    request, api_client, adapters, ec2, live_server, settings, tmp_path
):
    """The rendered bootstrap run as a first boot, from a mirror holding stand-ins for the
    worker and vLLM: vLLM goes into its own virtualenv, its `vllm` on the serving process's
    PATH, and the serving process starts with the replica's token and vLLM arguments."""
    mirror = tmp_path / "mirror"
    stand_in_index(mirror)
    settings.VERI_PUBLIC_URL = live_server.url
    settings.VERI_WORKER_INDEX_URL = f"file://{mirror}"
    settings.VERI_WORKER_PACKAGE = "veri-stand-in==1.0"
    settings.VERI_VLLM_REQUIREMENT = "vllm-stand-in==1.0"
    created = api_client.post(
        "/v1/deployments",
        {"adapters": adapters, "provider": "aws", "gpu_type": "L4-24GB", "region": "us-east-1"},
        format="json",
    )
    assert created.status_code == 201, created.json()
    replica = Replica.objects.get(deployment__public_id=created.json()["id"])
    assert tasks.launch_replica(replica_id=replica.pk) == "launched"

    status, log, root = boot(tmp_path, aws_script(ec2, request), timeout=300)

    assert status == 0, log
    ran = json.loads((root / "work" / "ran.json").read_text())
    assert ran["argv"][:3] == ["serve", "--replica", replica.public_id]
    assert ran["argv"][-6:] == [
        "--engine",
        "vllm",
        "--tensor-parallel-size",
        "1",
        "--max-loras",
        "2",
    ]
    assert ran["env"]["VERI_REPLICA_TOKEN"].startswith("veri_rt_")
    assert ran["env"]["VERI_SERVING_KEY"] == replicas.serving_key(replica=replica)
    assert ran["vllm"] == str(root / "engine" / "bin" / "vllm")  # its own virtualenv
    assert "[veri] installed vllm-stand-in==1.0 in" in log
