"""A job's start-up timings: the control plane stamps what it sees, the worker reports the
phases only it knows, and a worker's report is hostile (refused, clamped or ignored)."""

from datetime import datetime

import pytest

from tests.conftest import fill_volume
from tests.training.conftest import worker_client
from tests.training.test_worker_and_jobs_api import upload_checkpoint, w
from training import tasks
from worker.runner import registration

pytestmark = pytest.mark.django_db


def when(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def test_a_hostile_worker_cannot_bend_the_timings(api_client, submit, workspace):
    fill_volume(workspace, "weights", {"model.bin": b"w" * 1000})
    job = submit(volumes=["weights"])

    def timings() -> dict:
        return api_client.get(f"/v1/training_jobs/{job.public_id}").json()["timings"]

    # Before the worker registered, nothing it says is kept.
    tasks.provision_job(job_id=job.pk)
    worker = worker_client(job)
    early = worker.post(w(job, "timings"), {"phase": "model_loaded"}, format="json")
    assert early.status_code == 200 and early.json()["recorded"] is False
    assert timings()["model_loaded_at"] is None and timings()["launched_at"]

    worker.post(w(job, "register"), registration(), format="json")
    # Unknown phases (including the control plane's own) and negative figures are refused.
    for body, field in (
        ({"phase": "registered"}, "phase"),
        ({"phase": "first_checkpoint"}, "phase"),
        ({"phase": "volumes_synced", "synced_bytes": -1}, "synced_bytes"),
        ({"phase": "volumes_synced", "sync_seconds": -5}, "sync_seconds"),
        ({"phase": "volumes_synced", "synced_bytes": "lots"}, "synced_bytes"),
    ):
        refused = worker.post(w(job, "timings"), body, format="json")
        assert refused.status_code == 400 and refused.json()["error"]["field"] == field
    # Implausible figures are clamped: no more bytes than the job's volumes hold, no more
    # seconds than since the worker registered.
    synced = worker.post(
        w(job, "timings"),
        {"phase": "volumes_synced", "synced_bytes": 10**15, "sync_seconds": 10**6},
        format="json",
    )
    assert synced.json()["recorded"] is True
    shown = timings()
    assert shown["synced_bytes"] == 1000
    elapsed = (when(shown["volumes_synced_at"]) - when(shown["registered_at"])).total_seconds()
    assert 0 <= shown["sync_seconds"] <= elapsed
    # A phase is kept once, and never after a later one.
    assert worker.post(w(job, "timings"), {"phase": "first_step"}, format="json").json()["recorded"]
    for phase in ("volumes_synced", "model_loaded", "first_step"):
        again = worker.post(w(job, "timings"), {"phase": phase, "synced_bytes": 1}, format="json")
        assert again.json()["recorded"] is False
    assert timings()["model_loaded_at"] is None and timings()["synced_bytes"] == 1000
    # The first checkpoint is the control plane's to stamp, when it records one.
    upload_checkpoint(worker, job, 5)
    shown = timings()
    order = ["queued", "launched", "registered", "volumes_synced", "first_step", "first_checkpoint"]
    stamps = [when(shown[f"{p}_at"]) for p in order]
    assert stamps == sorted(stamps)
    assert shown["until_first_step_seconds"] == pytest.approx(
        (stamps[4] - stamps[0]).total_seconds()
    )

    # Another job's token reports nothing on this one.
    other = submit()
    tasks.provision_job(job_id=other.pk)
    foreign = worker_client(other).post(w(job, "timings"), {"phase": "first_step"}, format="json")
    assert foreign.status_code == 404
