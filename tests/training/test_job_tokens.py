"""Job tokens expire: a token lives VERI_JOB_TOKEN_TTL_SECONDS, the worker's runner renews its
own while the job lives (the token it renewed with stops after a short overlap), and a token of
an ended, cancelled or superseded (restarted) job is dead, renewed or not."""

import time

import httpx
import pytest
from rest_framework.test import APIClient

from tests.conftest import assert_error
from tests.training.test_restarts import machine_lost, running
from tests.training.test_worker_and_jobs_api import w
from training import tasks
from training.models import TrainingJob
from worker.client import ControlPlane, ControlPlaneError
from worker.runner import registration

pytestmark = pytest.mark.django_db


def as_worker(token: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    return client


def heartbeat(client: APIClient, job: TrainingJob):
    return client.post(w(job, "heartbeat"), {"step": None}, format="json")


def renew(client: APIClient, job: TrainingJob) -> str:
    answer = client.post(w(job, "token"), format="json")
    assert answer.status_code == 200, answer.json()
    return answer.json()["token"]


def assert_dead(client: APIClient, job: TrainingJob) -> None:
    for response in (heartbeat(client, job), client.post(w(job, "token"), format="json")):
        assert_error(response, 401, "authentication_failed")


def test_a_token_past_its_lifetime_no_longer_heartbeats(submit, settings):
    settings.VERI_JOB_TOKEN_TTL_SECONDS = 3
    minted = time.monotonic()
    job, worker = running(submit)
    assert heartbeat(worker, job).status_code == 200
    time.sleep(max(0.0, minted + 3.2 - time.monotonic()))
    error = assert_error(heartbeat(worker, job), 401, "authentication_failed")
    assert "expired" in error["message"]
    job.refresh_from_db()
    assert job.status == "running"  # the job itself is untouched: only that credential is


def test_a_renewed_token_lives_on_and_the_one_renewed_with_stops_after_the_overlap(
    submit, settings
):
    settings.VERI_JOB_TOKEN_TTL_SECONDS = 3600
    settings.VERI_JOB_TOKEN_OVERLAP_SECONDS = 2
    job, launched = running(submit)
    renewed_at = time.monotonic()
    answer = launched.post(w(job, "token"), format="json").json()
    assert answer["renew_after_seconds"] == 1800 and answer["expires_at"]
    first = as_worker(answer["token"])
    # Requests already sent with the launch token still land during the overlap.
    assert heartbeat(launched, job).status_code == 200
    # The renewal's answer was lost: a second later the runner asks again with the token it
    # still holds; the token of the lost answer dies, the new one works.
    time.sleep(max(0.0, renewed_at + 1.0 - time.monotonic()))
    second = as_worker(renew(launched, job))
    assert_dead(first, job)
    assert heartbeat(second, job).status_code == 200
    # Asking again did not lengthen the launch token's overlap.
    time.sleep(max(0.0, renewed_at + 2.5 - time.monotonic()))
    assert_dead(launched, job)
    assert heartbeat(second, job).status_code == 200
    third = as_worker(renew(second, job))  # renewed again, halfway through its lifetime
    assert heartbeat(third, job).status_code == 200


@pytest.mark.parametrize("end", ["completed", "cancelled while running", "failed"])
def test_tokens_of_an_ended_job_are_dead_renewed_or_not(submit, api_client, end):
    job, launched = running(submit)
    renewed = as_worker(renew(launched, job))
    if end == "completed":
        renewed.post(w(job, "complete"), {"ok": True}, format="json")
    elif end == "failed":
        renewed.post(
            w(job, "complete"),
            {"ok": False, "error_code": "training_error", "message": "boom"},
            format="json",
        )
    else:
        answer = api_client.post(f"/v1/training_jobs/{job.public_id}/cancel")
        assert answer.json()["status"] == "cancelled"
    assert_dead(launched, job)
    assert_dead(renewed, job)


def test_tokens_of_a_superseded_run_are_dead_and_the_relaunch_gets_its_own(submit, cloud):
    job, launched = running(submit)
    renewed = as_worker(renew(launched, job))
    assert machine_lost(cloud, job) == {"worker_failed": 1}  # restarted: a new run
    job.refresh_from_db()
    assert job.status == "queued"
    assert_dead(launched, job)
    assert_dead(renewed, job)
    assert tasks.provision_job(job_id=job.pk) == "launched"
    relaunched = as_worker(cloud.launched[-1].env["VERI_JOB_TOKEN"])
    assert relaunched.post(w(job, "register"), registration(), format="json").status_code == 200
    assert_dead(renewed, job)


@pytest.mark.django_db(transaction=True, serialized_rollback=True)
def test_the_runner_renews_its_token_while_its_job_lives(
    submit, cloud, api_client, live_server, settings
):
    """The runner's own client, against a real server: it swaps the token it was launched with
    (the one the machine's boot data holds) before its first request, renews halfway through
    each token's lifetime, so it keeps working long past one lifetime, and is cut off the
    moment the job is cancelled."""
    settings.VERI_JOB_TOKEN_TTL_SECONDS = 4  # renewed every 2 s
    settings.VERI_JOB_TOKEN_OVERLAP_SECONDS = 1
    job = submit()
    tasks.provision_job(job_id=job.pk)
    launch_token = cloud.launched[-1].env["VERI_JOB_TOKEN"]
    api = ControlPlane(api_url=live_server.url, job_id=job.public_id, token=launch_token)
    started = time.monotonic()
    assert api.call("POST", "/register", json=registration(), attempts=1)["status"] == "configuring"
    api.call("POST", "/status", json={"status": "running"}, attempts=1)
    time.sleep(max(0.0, started + 1.5 - time.monotonic()))
    # Past the overlap, within its own lifetime: the launch token no longer opens anything.
    with_launch_token = httpx.post(
        f"{live_server.url}{w(job, 'heartbeat')}",
        json={},
        headers={"Authorization": f"Bearer {launch_token}"},
    )
    assert with_launch_token.status_code == 401
    while time.monotonic() - started < 10:  # two and a half lifetimes
        api.call("POST", "/heartbeat", json={"step": 1}, attempts=1)
        time.sleep(0.25)
    assert job.tokens.count() <= 2
    answer = api_client.post(f"/v1/training_jobs/{job.public_id}/cancel")
    assert answer.json()["status"] == "cancelled"
    with pytest.raises(ControlPlaneError) as refused:
        api.call("POST", "/heartbeat", json={"step": 2}, attempts=1)
    assert refused.value.status == 401
