"""The worker's vLLM launcher (`python -m worker serve … --engine vllm`) against the live control
plane, with a stand-in `vllm` on PATH (tests/serving/vllm_standin.py: vLLM itself needs a GPU):
the arguments it starts vLLM with, waiting for its health before reporting ready with its URL,
heartbeats while it lives, and a failure with its last lines, attributed by the catalog, when it
exits."""

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from serving.models import Deployment, Replica
from serving.services import replicas
from tests.conftest import REPO, wait_for
from tests.providers.conftest import ec2, ec2_endpoint  # noqa: F401 - the fixtures
from tests.training.conftest import upload_dataset
from training.models import Checkpoint, Dataset, TrainingJob
from volumes.stores import store_for

pytestmark = pytest.mark.django_db(transaction=True)
BASE = "Qwen/Qwen2.5-0.5B"  # a hub id: vLLM (here its stand-in) takes the name as it is
# Adapter names as deployments give them; the second holds `=`, which vLLM's name=path form
# cannot carry.
NAMES = ["ft:Qwen/Qwen2.5-0.5B:acme:fruit:ftjob_a", "ckpt=b"]


@pytest.fixture
def replica(live_server, billed, settings, local_store_url, api_client, ec2) -> Replica:  # noqa: F811
    """A starting replica of a deployment of BASE with two adapters (ranks 8 and 12), its
    adapters' files in the store, its machine launched on EC2 (moto), which reports this
    machine's loopback as its address: the test runs the serving process here."""
    settings.VERI_STORE = local_store_url
    settings.VERI_REPLICA_HEARTBEAT_SECONDS = 1
    dataset = upload_dataset(api_client, [{"text": "row"}])
    job = TrainingJob.objects.create(
        workspace=billed,
        dataset=Dataset.objects.get(public_id=dataset["id"]),
        base_model=BASE,
        method="sft_text",
        status="completed",
    )
    adapters = []
    for name, rank in zip(NAMES, (8, 12), strict=True):
        config = json.dumps({"r": rank, "peft_type": "LORA"}).encode()
        checkpoint = Checkpoint.objects.create(
            workspace=billed,
            job=job,
            step=rank,
            files=[{"path": "adapter_config.json", "size": len(config)}],
        )
        [(_, key)] = checkpoint.file_keys()
        store_for(job.workspace_prefix).put_bytes(key, config)
        adapters.append({"name": name, "checkpoint_id": checkpoint.public_id})
    deployment = Deployment.objects.create(
        workspace=billed,
        base_model=BASE,
        adapters=adapters,
        gpu_type="H100-80GB",
        gpu_count=2,
        provider="aws",
        region="us-east-1",
        status="starting",
    )
    replica = Replica.objects.create(deployment=deployment, provider="aws")
    assert replicas.launch_replica(replica_id=replica.pk) == "launched"
    replica.refresh_from_db()
    ec2.addresses[replica.external_id.partition("/")[2]] = "127.0.0.1"
    return replica


def serve(replica: Replica, api: str, tmp_path: Path, **env) -> subprocess.Popen:
    """The replica's serving process as its machine's bootstrap starts it, `vllm` on its PATH."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    vllm = bin_dir / "vllm"
    vllm.write_text(f'#!/bin/sh\nexec {sys.executable} {REPO}/tests/serving/vllm_standin.py "$@"\n')
    vllm.chmod(0o755)
    command = replicas.serve_command(replica=replica, api=api, vllm=True)
    return subprocess.Popen(
        [sys.executable, "-m", "worker", *command],
        cwd=REPO,
        env={
            **os.environ,
            "PATH": f"{bin_dir}:{os.environ['PATH']}",
            "VERI_REPLICA_TOKEN": replicas.mint_token(replica=replica),
            "VERI_SERVING_KEY": replicas.serving_key(replica=replica),
            "VERI_WORK_DIR": str(tmp_path / "work"),
            "VLLM_STANDIN_RECORD": str(tmp_path / "vllm.json"),
            **env,
        },
    )


def ended(replica: Replica) -> Replica:
    replica.refresh_from_db()
    return replica if replica.status == "failed" else None


def test_vllm_starts_with_lora_for_each_adapter_and_reports_ready_with_its_url(
    live_server, replica, tmp_path
):
    worker = serve(replica, live_server.url, tmp_path)
    try:
        ready = wait_for(
            lambda: Replica.objects.filter(pk=replica.pk, status="ready").first(), 120, "ready"
        )
        started = json.loads((tmp_path / "vllm.json").read_text())
        args = started["argv"]
        port = args[args.index("--port") + 1]
        assert ready.url == f"http://127.0.0.1:{port}"
        work = tmp_path / "work" / "adapters"
        assert args == [
            "serve",
            BASE,
            "--host",
            "0.0.0.0",
            "--port",
            port,
            "--api-key",
            replicas.serving_key(replica=replica),
            "--served-model-name",
            BASE,
            "--tensor-parallel-size",
            "2",
            "--enable-lora",
            "--max-loras",
            "2",
            "--max-lora-rank",
            "16",  # the smallest of vLLM's ranks that holds 12
            "--lora-modules",
            f"{NAMES[0]}={work / '0'}",
            json.dumps({"name": NAMES[1], "path": str(work / "1")}),
        ]
        assert json.loads((work / "1" / "adapter_config.json").read_text())["r"] == 12
        assert int(port) in range(8000, 8010)  # the ports the provider opened
        assert "VERI_REPLICA_TOKEN" not in started["env"]  # vLLM never holds the token
        assert "VERI_SERVING_KEY" not in started["env"]  # only its argument
        chat = {"model": NAMES[0], "stream": True}
        assert httpx.post(f"{ready.url}/v1/chat/completions", json=chat).status_code == 401
        key = {"Authorization": f"Bearer {replicas.serving_key(replica=replica)}"}
        answer = httpx.post(f"{ready.url}/v1/chat/completions", json=chat, headers=key)
        assert f'"content": "{NAMES[0]}"' in answer.text

        # Heartbeats while it serves; once the replica is stopped vLLM is stopped with it.
        beat = ready.last_heartbeat_at
        wait_for(
            lambda: Replica.objects.get(pk=replica.pk).last_heartbeat_at > beat, 30, "heartbeat"
        )
        replicas.stop_replicas(deployment=replica.deployment, reason="deleted")
        assert worker.wait(60) == 0
        with pytest.raises(ProcessLookupError):
            os.kill(started["pid"], 0)
    finally:
        worker.kill()


def test_vllm_crashing_while_serving_fails_the_replica_as_the_platforms_with_its_last_lines(
    live_server, replica, tmp_path
):
    worker = serve(replica, live_server.url, tmp_path)
    try:
        ready = wait_for(
            lambda: Replica.objects.filter(pk=replica.pk, status="ready").first(), 120, "ready"
        )
        with pytest.raises(httpx.HTTPError):
            httpx.post(
                f"{ready.url}/v1/chat/completions",
                json={"model": "crash"},
                headers={"Authorization": f"Bearer {replicas.serving_key(replica=replica)}"},
            )
        failed = wait_for(lambda: ended(replica), 60, "the failure report")
        assert failed.error_code == "replica_failed"
        assert "vLLM exited with status 1 after serving" in failed.error_message
        assert "CUDA error: an illegal memory access" in failed.error_message
        assert worker.wait(30) == 1
        deployment = Deployment.objects.get(pk=replica.deployment_id)
        assert deployment.status == "stopped"  # the next request starts a new replica
    finally:
        worker.kill()


def test_a_model_vllm_cannot_load_is_the_customers_model_load_error(live_server, replica, tmp_path):
    worker = serve(
        replica,
        live_server.url,
        tmp_path,
        VLLM_STANDIN_REFUSE="Model architectures ['Mystery'] are not supported",
    )
    try:
        failed = wait_for(lambda: ended(replica), 120, "the failure report")
        assert failed.error_code == "model_load_error"
        assert "vLLM exited with status 1 while loading the model" in failed.error_message
        assert "Model architectures ['Mystery'] are not supported" in failed.error_message
        assert worker.wait(30) == 1
        deployment = Deployment.objects.get(pk=replica.deployment_id)
        assert (deployment.status, deployment.error_attribution) == ("failed", "customer")
    finally:
        worker.kill()


def test_a_ready_report_refused_while_the_provider_names_no_address_is_sent_again(
    live_server,
    replica,
    tmp_path,
    ec2,  # noqa: F811
):
    machine = replica.external_id.partition("/")[2]
    ec2.states[machine] = "stopping"  # EC2 reports it gone: no address to route to
    asked = len(ec2.calls("DescribeInstances"))
    worker = serve(replica, live_server.url, tmp_path, VERI_REPLICA_READY_RETRY_SECONDS="1")
    try:
        wait_for(lambda: len(ec2.calls("DescribeInstances")) > asked, 120, "a ready report")
        replica.refresh_from_db()
        assert replica.status == "starting" and not replica.url  # refused
        del ec2.states[machine]  # EC2 now reports the machine, at this machine's loopback
        ready = wait_for(
            lambda: Replica.objects.filter(pk=replica.pk, status="ready").first(), 60, "ready"
        )
        assert ready.url.startswith("http://127.0.0.1:80")
        assert worker.poll() is None  # serving
    finally:
        worker.kill()
