"""The embedded default's first-run traps: a server on another port than VERI_PUBLIC_URL, and a
model hub id on workers that cannot reach a hub."""

import json
import os
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.utils import timezone

from providers.local import _start_time
from providers.models import Instance
from tests.conftest import assert_error, fill_volume, free_port, serve_in_background
from tests.training.conftest import GRPO_ROWS, REWARD, upload_dataset
from training import tasks
from training.models import TrainingJob
from training.services import jobs

pytestmark = pytest.mark.django_db


@pytest.fixture
def local_job(api_client, billed, settings, local_store_url, tmp_path):
    """Submit a job to the local provider (a folder here as its base model)."""
    settings.VERI_STORE = local_store_url
    settings.VERI_LOCAL_INSTANCES_DIR = str(tmp_path / "instances")
    dataset = upload_dataset(api_client, GRPO_ROWS)
    fill_volume(billed, "models", {"m/config.json": b"{}"})

    def submit(**overrides):
        body = {
            "base_model": "volume://models/m",
            "dataset_id": dataset["id"],
            "method": "grpo",
            "reward_source": REWARD,
            "provider": "local",
        } | overrides
        return api_client.post("/v1/training_jobs", body, format="json")

    return submit


def test_a_launch_the_worker_could_not_call_back_fails_at_once(local_job, settings):
    settings.VERI_PUBLIC_URL = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    job = TrainingJob.objects.get(public_id=local_job().json()["id"])
    assert tasks.provision_job(job_id=job.pk) == "provisioning_error"
    job.refresh_from_db()
    assert (job.status, job.error_code, job.error_attribution) == (
        "failed",
        "provisioning_error",
        "platform",
    )
    assert settings.VERI_PUBLIC_URL in job.error_message
    assert "VERI_PUBLIC_URL" in job.error_message
    assert not Instance.objects.filter(job=job).exists()  # nothing was started


def test_a_launch_is_refused_when_another_veri_answers_the_public_url(local_job, settings):
    """A stale clone still serving :8000 answers /healthz too; its workers would be refused."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), OtherVeri)
    serve_in_background(server)
    settings.VERI_PUBLIC_URL = f"http://127.0.0.1:{server.server_port}"
    try:
        job = TrainingJob.objects.get(public_id=local_job().json()["id"])
        assert tasks.provision_job(job_id=job.pk) == "provisioning_error"
    finally:
        server.shutdown()
    job.refresh_from_db()
    assert "another Veri deployment" in job.error_message


class OtherVeri(BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({"deployment": "0123456789abcdef", "database": "ok"}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_a_worker_that_never_registers_fails_after_the_register_deadline(local_job, settings):
    job = TrainingJob.objects.get(public_id=local_job().json()["id"])
    jobs.transition_job(job_id=job.pk, to="provisioning")
    alive = f"{os.getpid()}:{_start_time(os.getpid())}"  # an instance that is still up
    Instance.objects.create(
        job=job,
        provider="local",
        region=job.region,
        zone="local",
        gpu_type="cpu",
        gpu_count=1,
        external_id=alive,
        launched_at=timezone.now(),
        price_per_hour_micros=0,
    )
    limit = settings.VERI_LOCAL_REGISTER_TIMEOUT_SECONDS
    assert tasks.check_jobs(now=timezone.now() + timedelta(seconds=limit - 5)) == {}
    late = timezone.now() + timedelta(seconds=limit + 5)
    assert tasks.check_jobs(now=late) == {"provisioning_error": 1}
    job.refresh_from_db()
    assert job.error_code == "provisioning_error"
    assert f"VERI_PUBLIC_URL={settings.VERI_PUBLIC_URL}" in job.error_message


def test_offline_local_workers_refuse_a_hub_id_not_in_the_cache(local_job, settings, tmp_path):
    settings.VERI_LOCAL_HUB_OFFLINE = True
    settings.VERI_LOCAL_HF_CACHE = str(tmp_path / "hub")
    error = assert_error(
        local_job(base_model="Qwen/Qwen2.5-0.5B-Instruct"),
        400,
        "base_model_unavailable",
        "base_model",
    )
    assert "volume://" in error["message"]
    assert not TrainingJob.objects.exists()
    snapshot = tmp_path / "hub" / "models--Qwen--Qwen2.5-0.5B-Instruct" / "snapshots" / "abc"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    assert local_job(base_model="Qwen/Qwen2.5-0.5B-Instruct").status_code == 201  # cached


def test_local_workers_with_network_take_hub_ids(local_job, settings, tmp_path):
    settings.VERI_LOCAL_HUB_OFFLINE = False
    settings.VERI_LOCAL_HF_CACHE = str(tmp_path / "hub")
    assert local_job(base_model="Qwen/Qwen2.5-0.5B-Instruct").status_code == 201


def test_a_folder_is_never_a_base_model(local_job, tmp_path):
    """A folder of the machine would let a job read what another job left there."""
    for folder in (str(tmp_path), "/tmp", ".veri/store", "../x"):
        assert_error(local_job(base_model=folder), 400, "invalid_base_model", "base_model")
