"""Jobs submitted through /v1 run on the local provider, launched by a real qcluster, with a stub
worker speaking the worker API; a second job waits for the one local slot."""

import os
import re
import signal
import sys
from pathlib import Path

import pytest

from billing.services import open_billing_account
from providers.local import LocalProvider
from providers.models import Instance
from tests.conftest import REPO, fill_volume, wait_for
from tests.training.conftest import REWARD, upload_dataset
from training.models import TrainingJob

# serialized_rollback: the schedules a migration wrote survive earlier tests' table flushes.
pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True, serialized_rollback=True)]


def test_local_provider_runs_queued_jobs_one_slot_at_a_time(
    api_client, workspace, live_server, qcluster, settings, tmp_path, local_store_url
):
    settings.VERI_STORE = local_store_url
    open_billing_account(workspace=workspace, credit_micros=100_000_000)
    dataset = upload_dataset(api_client, [{"prompt": "2 + 2 ="}])
    fill_volume(workspace, "models", {"tiny/config.json": b"{}"})
    qcluster(
        VERI_PUBLIC_URL=live_server.url,
        VERI_LOCAL_WORKER_COMMAND=f"{sys.executable} {REPO / 'tests/e2e/stub_worker.py'}",
        VERI_LOCAL_INSTANCES_DIR=str(tmp_path / "instances"),
        VERI_LOCAL_SLOTS="1",
        STUB_STEP_SECONDS="1",
    )
    body = {
        "base_model": "volume://models/tiny",
        "dataset_id": dataset["id"],
        "method": "grpo",
        "reward_source": REWARD,
    }
    first, second = (
        api_client.post("/v1/training_jobs", body, format="json").json()["id"] for _ in range(2)
    )

    def status(job_id: str) -> str:
        return TrainingJob.objects.get(public_id=job_id).status

    def settled(job_id: str) -> bool:  # terminal, and the settle task has run
        return TrainingJob.objects.filter(
            public_id=job_id, billing__cost_attributed_at__isnull=False
        ).exists()

    wait_for(lambda: status(first) == "running", 60, "the first job to run")
    assert status(second) == "queued"  # the one local slot is taken
    wait_for(lambda: settled(first), 60, "the first job to complete")
    wait_for(lambda: settled(second), 90, "the second job to complete")

    for job_id in (first, second):
        got = api_client.get(f"/v1/training_jobs/{job_id}").json()
        assert (got["status"], got["last_step"]) == ("completed", 3), got
        assert got["cost_usd"] is not None and got["cost_attributed_at"] is not None
        full = api_client.get(f"/v1/training_jobs/{job_id}/logs/full").getvalue().decode()
        assert "stub step 3 of grpo on volume://models/tiny" in full
        [final] = api_client.get(f"/v1/training_jobs/{job_id}/checkpoints").json()["data"]
        assert final["final"] and final["files"][0]["path"] == "adapter_config.json"
        instance = Instance.objects.get(job__public_id=job_id)
        assert instance.terminated_at is not None
        assert not LocalProvider._alive(instance.external_id)
        worker_log = (tmp_path / "instances" / job_id / "worker.log").read_text()
        assert "stub worker starting" in worker_log


def process_state(pid: int) -> str | None:
    """`ps`'s STAT letter for `pid` (`Z`: a zombie, `<defunct>`), or None when it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return None


def test_a_killed_local_job_leaves_no_zombie_and_the_cluster_says_what_it_did(
    api_client, workspace, live_server, qcluster, settings, tmp_path, local_store_url
):
    settings.VERI_STORE = local_store_url
    open_billing_account(workspace=workspace, credit_micros=100_000_000)
    dataset = upload_dataset(api_client, [{"prompt": "2 + 2 ="}])
    fill_volume(workspace, "models", {"tiny/config.json": b"{}"})
    cluster = qcluster(
        VERI_PUBLIC_URL=live_server.url,
        VERI_LOCAL_WORKER_COMMAND=f"{sys.executable} {REPO / 'tests/e2e/stub_worker.py'}",
        VERI_LOCAL_INSTANCES_DIR=str(tmp_path / "instances"),
        STUB_STEP_SECONDS="600",  # runs until killed
    )
    body = {
        "base_model": "volume://models/tiny",
        "dataset_id": dataset["id"],
        "method": "grpo",
        "reward_source": REWARD,
        "auto_resume": False,
    }
    job_id = api_client.post("/v1/training_jobs", body, format="json").json()["id"]
    job = TrainingJob.objects.filter(public_id=job_id)
    wait_for(lambda: job.get().status == "running", 60, "the job to run")
    host = int(Instance.objects.get(job__public_id=job_id).external_id.split(":")[0])
    assert process_state(host) not in (None, "Z")
    os.killpg(host, signal.SIGKILL)  # the machine dies under the job
    # Reaped by the task worker that launched it, with the cluster still up: not `<defunct>`.
    wait_for(lambda: process_state(host) is None, 30, f"host {host} to be reaped, not a zombie")
    assert cluster.poll() is None
    wait_for(lambda: job.get().settled_at, 90, "the job to fail and settle")
    assert job.get().status == "failed"

    cluster.terminate()
    output = cluster.communicate(timeout=60)[0].decode()
    assert re.search(r"INFO \S+: task cluster 'veri' starting: 2 workers", output), output
    assert "schedule training.tasks.watch_jobs: every 1 min" in output, output
    assert f"launch of {job_id} on local (cpu): launched" in output, output
    assert f"settled {job_id}: failed ({job.get().error_code})" in output, output
