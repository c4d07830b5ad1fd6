"""The worker's endpoints (job token) and the customer's job endpoints (API key)."""

import httpx
import pytest
from rest_framework.test import APIClient

from tests.conftest import assert_error, fill_volume, put_to_url
from tests.training.conftest import drive, worker_client
from tests.volumes.test_api import sha, upload
from training import errors, tasks
from training.models import Checkpoint, JobEvent, JobStatus, TrainingJob
from training.services import jobs
from volumes.stores import get_store
from worker.runner import registration

pytestmark = pytest.mark.django_db
S = JobStatus


@pytest.fixture
def launched(submit):
    """A submitted job whose instance is up; returns (job, the worker's client)."""
    job = submit()
    tasks.provision_job(job_id=job.pk)
    job.refresh_from_db()
    return job, worker_client(job)


def w(job: TrainingJob, action: str) -> str:
    return f"/v1/worker/jobs/{job.public_id}/{action}"


def upload_checkpoint(worker: APIClient, job: TrainingJob, step: int, final: bool = False) -> dict:
    files = {"adapter_model.safetensors": b"weights" * 10, "adapter_config.json": b"{}"}
    folder = "final" if final else f"checkpoints/step-{step:08d}"
    answer = worker.post(
        w(job, "output-credentials"),
        {"paths": [f"{folder}/{name}" for name in files]},
        format="json",
    ).json()
    for entry, data in zip(answer["files"], files.values(), strict=True):
        assert put_to_url(worker, entry["url"], data).status_code == 200
    response = worker.post(
        w(job, "checkpoints"),
        {
            "step": step,
            "final": final,
            "files": [{"path": name, "size": len(data)} for name, data in files.items()],
        },
        format="json",
    )
    assert response.status_code == 201, response.json()
    return response.json()


def test_a_worker_runs_a_job_to_completion(api_client, launched):
    job, worker = launched
    assert worker.post(
        w(job, "register"), registration() | {"hostname": "gpu-1"}, format="json"
    ).json() == {"status": "configuring"}
    spec = worker.get(w(job, "spec")).json()
    assert (spec["job_id"], spec["method"], spec["base_model"]) == (
        job.public_id,
        "grpo",
        "tiny/model",
    )
    assert spec["dataset"]["source"] == "upload" and spec["dataset"]["url"].startswith(
        "http://testserver/"
    )
    assert (
        b"What is 1 + 1?"
        in APIClient().get(spec["dataset"]["url"].removeprefix("http://testserver")).getvalue()
    )
    assert spec["reward_source"].startswith("def reward(")
    assert (
        worker.post(w(job, "status"), {"status": "running"}, format="json").json()["status"]
        == "running"
    )
    lines = [{"seq": i, "text": f"step {i}"} for i in range(5)]
    assert worker.post(w(job, "logs"), {"lines": lines}, format="json").json()["added"] == 5
    assert (
        worker.post(w(job, "logs"), {"lines": lines[3:]}, format="json").json()["added"] == 0
    )  # resent
    worker.post(w(job, "logs"), {"lines": [{"seq": 9, "text": "after a gap"}]}, format="json")
    for step in (1, 2):
        worker.post(
            w(job, "metrics"),
            {"points": [{"step": step, "values": {"loss": 1.0 / step, "reward": step / 10}}]},
            format="json",
        )
    worker.post(w(job, "heartbeat"), {"step": 2}, format="json")
    upload_checkpoint(worker, job, step=2, final=True)
    assert (
        worker.post(w(job, "complete"), {"ok": True}, format="json").json()["status"] == "completed"
    )

    got = api_client.get(f"/v1/training_jobs/{job.public_id}").json()
    assert got["status"] == "completed" and got["started_at"] and got["finished_at"]
    assert got["last_step"] == 2
    assert got["metrics_summary"] == {
        "steps": 2,
        "last_step": 2,
        "first": {"loss": 1.0, "reward": 0.1},
        "last": {"loss": 0.5, "reward": 0.2},
    }
    types = [
        e["type"]
        for e in api_client.get(f"/v1/training_jobs/{job.public_id}/events").json()["data"]
    ]
    assert types == [
        "queued",
        "provisioning",
        "configuring",
        "running",
        "checkpoint_saved",
        "completed",
    ]
    metrics = api_client.get(f"/v1/training_jobs/{job.public_id}/metrics").json()["data"]
    assert [(m["step"], m["values"]["loss"]) for m in metrics] == [(1, 1.0), (2, 0.5)]

    after = api_client.get(f"/v1/training_jobs/{job.public_id}/logs", {"after": 2}).json()
    assert [line["seq"] for line in after["lines"]] == [3, 4, 9] and after["next_seq"] == 9
    assert after["finished"] is True
    # The worker's token died with the job.
    assert_error(
        worker.post(w(job, "heartbeat"), {"step": 3}, format="json"), 401, "authentication_failed"
    )


def test_full_log_is_the_concatenation_and_survives_the_job(api_client, launched):
    job, worker = launched
    worker.post(w(job, "register"), registration(), format="json")
    lines = [{"seq": i, "text": f"line {i}"} for i in range(30)]
    worker.post(w(job, "logs"), {"lines": lines[10:]}, format="json")
    worker.post(w(job, "logs"), {"lines": lines[:10]}, format="json")  # an older batch, late
    full = api_client.get(f"/v1/training_jobs/{job.public_id}/logs/full")
    expected = "".join(f"line {i}\n" for i in range(30))
    assert (full.status_code, full["Content-Type"], full.getvalue().decode()) == (
        200,
        "text/plain; charset=utf-8",
        expected,
    )
    assert tasks.archive_running_logs() == 1
    assert tasks.archive_running_logs() == 0  # nothing new since
    worker.post(
        w(job, "complete"),
        {"ok": False, "error_code": "training_error", "message": "boom"},
        format="json",
    )
    jobs.close_out_job(job=TrainingJob.objects.select_related("workspace").get(pk=job.pk))
    assert get_store().get_bytes(job.log_key).decode() == expected
    full = api_client.get(f"/v1/training_jobs/{job.public_id}/logs/full")
    assert full.getvalue().decode() == expected


def test_a_finished_job_without_log_says_so(api_client, launched):
    job, _ = launched
    assert api_client.get(f"/v1/training_jobs/{job.public_id}/logs/full").getvalue() == b""
    logs = api_client.get(f"/v1/training_jobs/{job.public_id}/logs").json()
    assert logs == {"lines": [], "next_seq": -1, "finished": False}
    jobs.cancel_job(job=job)
    error = assert_error(
        api_client.get(f"/v1/training_jobs/{job.public_id}/logs/full"), 404, "log_not_uploaded"
    )
    assert error["message"] == "log was never uploaded for this job"


@pytest.mark.parametrize("code", errors.WORKER_CODES)
def test_every_worker_reported_code_fails_the_job_with_its_attribution(submit, code):
    job = submit(auto_resume=False)  # a restartable code would restart it (test_restarts.py)
    tasks.provision_job(job_id=job.pk)
    worker = worker_client(job)
    worker.post(w(job, "register"), registration(), format="json")
    worker.post(w(job, "status"), {"status": "running"}, format="json")
    # From the phase whose runner check finds it (a platform fault), or any (the customer's).
    phase = max(errors.PLATFORM_FAULT_PHASES.get(code, {"training"}))
    if phase != "sync":
        assert worker.post(w(job, "phase"), {"phase": phase}, format="json").status_code == 200
    response = worker.post(
        w(job, "complete"),
        {"ok": False, "error_code": code, "message": f"{code} happened"},
        format="json",
    )
    assert response.json()["status"] == "failed"
    job.refresh_from_db()
    assert (job.error_code, job.error_message, job.error_attribution) == (
        code,
        f"{code} happened",
        errors.get(code).attribution,
    )
    assert JobEvent.objects.get(job=job, type="failed").detail["code"] == code


OUT_OF_PHASE = [
    (code, phase)
    for code, believed_in in errors.PLATFORM_FAULT_PHASES.items()
    for phase in errors.PHASES
    if phase not in believed_in
]


@pytest.mark.parametrize("code, phase", OUT_OF_PHASE)
def test_a_platform_fault_from_the_wrong_phase_is_the_jobs_own_error(submit, code, phase):
    """Customer code runs in the training phase: a platform code reported from a phase whose
    runner checks cannot find it is refused, recorded, and the job fails as its own error:
    charged, no refund, no restart."""
    job = submit()  # auto_resume on: a believed hardware_error would restart it
    tasks.provision_job(job_id=job.pk)
    worker = worker_client(job)
    worker.post(w(job, "register"), registration(), format="json")
    for step in errors.PHASES[1 : errors.PHASES.index(phase) + 1]:
        assert worker.post(w(job, "phase"), {"phase": step}, format="json").status_code == 200
    response = worker.post(
        w(job, "complete"),
        {"ok": False, "error_code": code, "message": "the platform broke, honest"},
        format="json",
    )
    assert response.json()["status"] == "failed"
    job.refresh_from_db()
    assert (job.error_code, job.error_attribution, job.attempt) == ("training_error", "customer", 1)
    assert code in job.error_message and "the platform broke, honest" in job.error_message
    refused = JobEvent.objects.get(job=job, type="fault_refused").detail
    assert (refused["code"], refused["phase"]) == (code, phase)
    assert not hasattr(job, "refund") or job.refund is None


def test_phases_only_go_forward(launched):
    job, worker = launched
    worker.post(w(job, "register"), registration(), format="json")
    assert worker.post(w(job, "phase"), {"phase": "training"}, format="json").status_code == 200
    assert_error(
        worker.post(w(job, "phase"), {"phase": "sync"}, format="json"), 409, "invalid_phase"
    )
    assert TrainingJob.objects.get(pk=job.pk).worker_phase == "training"


def test_workers_cannot_report_control_plane_codes_or_other_moves(launched):
    job, worker = launched
    bad = worker.post(
        w(job, "complete"), {"ok": False, "error_code": "QUOTA_EXCEEDED"}, format="json"
    )
    assert_error(bad, 400, "invalid_error_code", field="error_code")
    assert_error(
        worker.post(w(job, "status"), {"status": "completed"}, format="json"), 400, "invalid_status"
    )
    # running before registering skips configuring: refused, nothing changes.
    assert_error(
        worker.post(w(job, "status"), {"status": "running"}, format="json"),
        409,
        "invalid_transition",
    )
    assert TrainingJob.objects.get(pk=job.pk).status == S.PROVISIONING


def test_multi_gpu_training_errors_are_pending_review(submit):
    job = submit(gpu_count=4)
    tasks.provision_job(job_id=job.pk)
    drive(job, S.CONFIGURING, S.RUNNING)
    worker_client(job).post(
        w(job, "complete"), {"ok": False, "error_code": "training_error"}, format="json"
    )
    job.refresh_from_db()
    assert job.error_attribution == "pending"


def test_job_tokens_open_their_own_job_only(api_client, submit):
    first, second = submit(), submit()
    for job in (first, second):
        tasks.provision_job(job_id=job.pk)
    worker = worker_client(first)
    assert_error(worker.get(w(second, "spec")), 404, "not_found")
    assert_error(worker.post(w(second, "complete"), {"ok": True}, format="json"), 404, "not_found")
    assert_error(worker.get(f"/v1/training_jobs/{first.public_id}"), 401, "authentication_failed")
    assert_error(worker.get("/v1/volumes"), 401, "authentication_failed")
    assert_error(api_client.get(w(first, "spec")), 401, "authentication_failed")  # an API key
    nobody = APIClient()
    assert_error(nobody.get(w(first, "spec")), 401, "not_authenticated")
    assert TrainingJob.objects.get(pk=second.pk).status == S.PROVISIONING


def test_checkpoints_keep_the_newest_and_list_signed_urls(api_client, submit):
    job = submit(checkpoint_every=5, checkpoint_keep=2)
    tasks.provision_job(job_id=job.pk)
    job.refresh_from_db()
    worker = worker_client(job)
    worker.post(w(job, "register"), registration(), format="json")
    for step in (5, 10, 15, 20):
        upload_checkpoint(worker, job, step)
    listed = api_client.get(f"/v1/training_jobs/{job.public_id}/checkpoints").json()["data"]
    assert [c["step"] for c in listed] == [15, 20]
    file = listed[0]["files"][0]
    assert file["path"] == "adapter_model.safetensors" and file["size"] == 70
    assert (
        APIClient().get(file["url"].removeprefix("http://testserver")).getvalue() == b"weights" * 10
    )
    missing = worker.post(
        w(job, "checkpoints"), {"step": 25, "files": [{"path": "x.bin", "size": 1}]}, format="json"
    )
    assert_error(missing, 400, "checkpoint_incomplete", field="files")


def test_resume_starts_a_new_job_from_the_newest_checkpoint(api_client, submit):
    job = submit(checkpoint_every=5, hyperparameters={"max_steps": 20})
    tasks.provision_job(job_id=job.pk)
    job.refresh_from_db()
    worker = worker_client(job)
    worker.post(w(job, "register"), registration(), format="json")
    assert_error(
        api_client.post(f"/v1/training_jobs/{job.public_id}/resume", {}, format="json"),
        400,
        "no_checkpoint",
    )
    upload_checkpoint(worker, job, 5)
    newest = upload_checkpoint(worker, job, 10)
    worker.post(w(job, "complete"), {"ok": False, "error_code": "oom"}, format="json")
    response = api_client.post(f"/v1/training_jobs/{job.public_id}/resume", {}, format="json")
    assert response.status_code == 201
    resumed = response.json()
    assert resumed["id"] != job.public_id and resumed["resume_from"] == newest["id"]
    assert resumed["status"] == "queued" and resumed["hyperparameters"] == job.hyperparameters
    new_job = TrainingJob.objects.get(public_id=resumed["id"])
    tasks.provision_job(job_id=new_job.pk)
    spec = worker_client(new_job).get(w(new_job, "spec")).json()
    assert spec["resume_from"]["step"] == 10 and len(spec["resume_from"]["files"]) == 2
    assert Checkpoint.objects.get(public_id=newest["id"]).resumed_by.get() == new_job


def test_resume_of_a_job_cancelled_before_its_first_checkpoint_says_so(api_client, submit):
    job = submit(checkpoint_every=10, hyperparameters={"max_steps": 20})
    assert api_client.post(f"/v1/training_jobs/{job.public_id}/cancel").status_code == 200
    answer = api_client.post(f"/v1/training_jobs/{job.public_id}/resume", {}, format="json")
    assert_error(answer, 400, "no_checkpoint")
    message = answer.json()["error"]["message"]
    assert "cancelled at its first step, before its first checkpoint (every 10 steps)" in message
    assert "set checkpoint_every" not in message


def test_a_job_that_trained_all_its_steps_has_nothing_to_resume(api_client, submit):
    job = submit(checkpoint_every=5, hyperparameters={"max_steps": 10})
    tasks.provision_job(job_id=job.pk)
    job.refresh_from_db()
    worker = worker_client(job)
    worker.post(w(job, "register"), registration(), format="json")
    upload_checkpoint(worker, job, 10)
    worker.post(w(job, "complete"), {"ok": False, "error_code": "upload_failed"}, format="json")
    answer = api_client.post(f"/v1/training_jobs/{job.public_id}/resume", {}, format="json")
    assert_error(answer, 400, "nothing_to_resume", "checkpoint_id")


def test_cancel_through_the_api_is_immediate(api_client, launched, cloud):
    job, _ = launched
    response = api_client.post(f"/v1/training_jobs/{job.public_id}/cancel", format="json")
    assert response.status_code == 200 and response.json()["status"] == "cancelled"
    assert cloud.terminated == ["i-0001"]
    assert response.json()["cost_usd"] == "0.00"
    again = api_client.post(f"/v1/training_jobs/{job.public_id}/cancel", format="json")
    assert again.status_code == 200


def test_every_job_endpoint_hides_other_workspaces(api_client, other_api_client, launched):
    job, _ = launched
    for method, suffix in [
        ("get", ""),
        ("post", "/cancel"),
        ("post", "/resume"),
        ("get", "/logs"),
        ("get", "/logs/full"),
        ("get", "/events"),
        ("get", "/metrics"),
        ("get", "/checkpoints"),
    ]:
        response = getattr(other_api_client, method)(
            f"/v1/training_jobs/{job.public_id}{suffix}", format="json"
        )
        assert_error(response, 404, "not_found")
    assert other_api_client.get("/v1/training_jobs").json()["data"] == []
    assert TrainingJob.objects.get(pk=job.pk).status == S.PROVISIONING


def test_volume_credentials_on_the_local_store_are_signed_urls(api_client, submit, workspace):
    fill_volume(workspace, "corpus", {"a.txt": b"abc"})
    job = submit(volumes=["corpus"])
    tasks.provision_job(job_id=job.pk)
    creds = worker_client(job).post(w(job, "volume-credentials"), format="json").json()
    [mounted] = creds["volumes"]
    assert (mounted["name"], mounted["file_count"], mounted["total_bytes"]) == ("corpus", 1, 3)
    url = mounted["files"][0]["url"]
    assert APIClient().get(url.removeprefix("http://testserver")).getvalue() == b"abc"


def test_volume_credentials_on_s3_are_scoped_sts_credentials(
    api_client, submit, workspace, settings, s3_store_url
):
    from volumes import services as volume_services

    settings.VERI_STORE = s3_store_url
    volume_services.create_volume(workspace=workspace, name="corpus")
    job = submit(volumes=["corpus"])
    tasks.provision_job(job_id=job.pk)
    [mounted] = (
        worker_client(job).post(w(job, "volume-credentials"), format="json").json()["volumes"]
    )
    creds = mounted["credentials"]
    assert creds["kind"] == "s3" and creds["session_token"]
    assert creds["prefix"].endswith(f"/volumes/{mounted['id']}/")
    httpx.get(settings.AWS_ENDPOINT_URL)  # the S3 server is up; moto does not enforce the policy


def test_operators_cancel_jobs_from_the_admin(launched, cloud):
    from django.contrib.auth.models import User
    from django.test import Client

    job, worker = launched
    worker.post(
        w(job, "logs"), {"lines": [{"seq": 1, "text": "hello from the worker"}]}, format="json"
    )
    User.objects.create_superuser("op", "op@example.com", "pw")
    admin = Client()
    admin.login(username="op", password="pw")
    page = admin.get(f"/admin/training/trainingjob/{job.pk}/change/").content.decode()
    assert "hello from the worker" in page and "provisioning" in page
    listing = admin.get("/admin/training/trainingjob/?status__exact=provisioning&provider=aws")
    assert job.public_id in listing.content.decode()
    admin.post("/admin/training/trainingjob/", {"action": "cancel", "_selected_action": [job.pk]})
    job.refresh_from_db()
    assert job.status == S.CANCELLED and cloud.terminated == ["i-0001"]


def test_resent_metric_points_keep_their_first_values(api_client, launched):
    job, worker = launched
    worker.post(w(job, "register"), registration(), format="json")
    first = {"points": [{"step": 1, "values": {"loss": 2.0}}, {"step": 1, "values": {"loss": 9.0}}]}
    assert worker.post(w(job, "metrics"), first, format="json").json()["added"] == 1
    resent = {
        "points": [{"step": 1, "values": {"loss": 5.0}}, {"step": 2, "values": {"loss": 1.0}}]
    }
    assert worker.post(w(job, "metrics"), resent, format="json").json()["added"] == 1
    got = api_client.get(f"/v1/training_jobs/{job.public_id}").json()
    assert got["metrics_summary"] == {
        "steps": 2,
        "last_step": 2,
        "first": {"loss": 2.0},
        "last": {"loss": 1.0},
    }
    points = api_client.get(f"/v1/training_jobs/{job.public_id}/metrics").json()["data"]
    assert [(p["step"], p["values"]["loss"]) for p in points] == [(1, 2.0), (2, 1.0)]


def test_only_a_sha256_the_store_checked_reaches_the_worker(api_client, submit, settings):
    """A single PUT is signed with the file's sha256, so the store refuses other bytes; a multipart
    upload's parts are checked only against their own MD5s, so its sha256 is the uploader's word.
    The worker's sync blames the platform (volume_sync_incomplete, refunded) for bytes that differ
    from the sha256 it is given: an uploader's false one must not reach it."""
    volume = api_client.post("/v1/volumes", {"name": "corpus"}, format="json").json()
    small = upload(api_client, volume["id"], "small.txt", b"abc")
    assert small.status_code == 200, small.json()
    settings.VERI_MULTIPART_THRESHOLD = 10
    false_sha = "0" * 64
    announced = {"path": "weights.bin", "size": 100, "sha256": false_sha}
    started = api_client.post(f"/v1/volumes/{volume['id']}/files", announced, format="json").json()
    [part] = started["parts"]
    etag = put_to_url(api_client, part["url"], b"x" * 100)["ETag"].strip('"')
    done = api_client.post(
        f"/v1/volumes/{volume['id']}/uploads/{started['upload_id']}/complete",
        {"parts": [{"number": 1, "etag": etag}]},
        format="json",
    )
    assert done.status_code == 200, done.json()
    listed = api_client.get(f"/v1/volumes/{volume['id']}/files").json()["data"]
    assert {f["path"]: f["sha256"] for f in listed} == {
        "small.txt": sha(b"abc"),
        "weights.bin": false_sha,  # listed as announced: what a re-upload is compared with
    }

    job = submit(volumes=["corpus"])
    tasks.provision_job(job_id=job.pk)
    [mounted] = (
        worker_client(job).post(w(job, "volume-credentials"), format="json").json()["volumes"]
    )
    assert {f["path"]: f["sha256"] for f in mounted["files"]} == {
        "small.txt": sha(b"abc"),
        "weights.bin": "",  # checked by its size alone
    }
