"""Jobs stopped for money: the budget cap and an exhausted balance, through the watchdog and the
worker's heartbeat, charged up to the cap and never past it."""

from datetime import timedelta

import pytest
from django.utils import timezone

from billing import services
from billing.models import LedgerEntry
from providers.models import Instance
from tests.training.conftest import drive, worker_client
from training import tasks
from training.models import TrainingJob

pytestmark = pytest.mark.django_db
L4_HOUR = 805_000


def running_for(submit, minutes: float, **fields) -> TrainingJob:
    job = submit(**fields)
    tasks.provision_job(job_id=job.pk)
    launched = timezone.now() - timedelta(minutes=minutes)
    Instance.objects.filter(job=job).update(launched_at=launched)
    return drive(job, "configuring", "running")


def heartbeat(job: TrainingJob) -> dict:
    client = worker_client(job)
    return client.post(f"/v1/worker/jobs/{job.public_id}/heartbeat", {"step": 3}, format="json")


def test_a_job_at_its_budget_is_asked_to_stop_and_charged_the_cap(submit, api_client):
    job = running_for(submit, 30, max_cost_usd="0.25")  # 30 min of an L4 is ~0.40 USD
    token_client = worker_client(job)  # minted before the stop, as the worker's is
    assert tasks.check_jobs() == {"budget_exceeded": 1}
    assert tasks.check_jobs() == {}  # asked once
    answer = token_client.post(
        f"/v1/worker/jobs/{job.public_id}/heartbeat", {"step": 3}, format="json"
    ).json()
    assert answer["stop"]["code"] == "budget_exceeded" and "0.25" in answer["stop"]["message"]
    # The worker saves a checkpoint, then ends with the code it was given.
    token_client.post(
        f"/v1/worker/jobs/{job.public_id}/complete",
        {"ok": False, "error_code": "budget_exceeded", "message": "stopped at step 3"},
        format="json",
    )
    tasks.settle_job(job_id=job.pk)
    got = api_client.get(f"/v1/training_jobs/{job.public_id}").json()
    assert (got["status"], got["error"]["code"], got["error"]["attribution"]) == (
        "failed",
        "budget_exceeded",
        "customer",
    )
    assert (got["cost_usd"], got["max_cost_usd"], got["refund"]) == ("0.25", "0.25", None)
    assert list(LedgerEntry.objects.filter(job=job).values_list("kind", "amount_micros")) == [
        ("job_charge", -250_000)
    ]


def test_a_job_under_its_budget_runs_on(submit):
    job = running_for(submit, 10, max_cost_usd="1")
    assert tasks.check_jobs() == {}
    assert heartbeat(job).json()["stop"] is None


def test_a_worker_that_does_not_stop_is_ended_after_the_grace(submit, settings):
    job = running_for(submit, 30, max_cost_usd="0.25")
    tasks.check_jobs()
    later = timezone.now() + timedelta(seconds=settings.VERI_STOP_GRACE_SECONDS + 1)
    tasks.check_jobs(now=later)
    job.refresh_from_db()
    assert (job.status, job.error_code) == ("failed", "budget_exceeded")
    assert "did not stop" in job.error_message


def test_a_job_over_budget_before_training_ends_at_once(submit):
    job = submit(max_cost_usd="0.01")
    tasks.provision_job(job_id=job.pk)
    Instance.objects.filter(job=job).update(launched_at=timezone.now() - timedelta(minutes=5))
    assert tasks.check_jobs() == {"budget_exceeded": 1}
    job.refresh_from_db()
    assert (job.status, job.error_code) == ("failed", "budget_exceeded")


def test_an_exhausted_balance_stops_running_jobs_after_the_grace(submit, billed, settings):
    settings.VERI_BALANCE_GRACE_SECONDS = 60  # shorter than the job's heartbeat deadline
    job = running_for(submit, 60)
    left = services.balance_micros(workspace=billed)
    services.record_entry(
        workspace=billed,
        kind=LedgerEntry.Kind.ADJUSTMENT,
        amount_micros=-(left - 500_000),  # 0.50 USD left; the hour so far accrued ~0.805
        key="test:spent",
    )
    now = timezone.now()
    assert tasks.check_jobs(now=now) == {}  # out of money: the grace period starts
    assert heartbeat(job).json()["stop"] is None
    after = now + timedelta(seconds=settings.VERI_BALANCE_GRACE_SECONDS + 1)
    assert tasks.check_jobs(now=after) == {"balance_exhausted": 1}
    job.refresh_from_db()
    assert job.stop_code == "balance_exhausted"
    # No card payments here: the way to credit is an operator, not a top-up that would fail.
    assert "Ask an operator for credit (card top-ups are off here)" in job.stop_message
    assert heartbeat(job).json()["stop"]["code"] == "balance_exhausted"


def test_a_top_up_within_the_grace_lets_jobs_run_on(submit, billed, settings):
    settings.VERI_BALANCE_GRACE_SECONDS = 60
    job = running_for(submit, 60)
    heartbeat(job)
    left = services.balance_micros(workspace=billed)
    services.record_entry(
        workspace=billed,
        kind=LedgerEntry.Kind.ADJUSTMENT,
        amount_micros=-(left - 500_000),
        key="test:spent",
    )
    now = timezone.now()
    tasks.check_jobs(now=now)
    services.add_credit(workspace=billed, amount_micros=50_000_000, reason="top-up", key="t:1")
    tasks.check_jobs(now=now + timedelta(seconds=30))
    after = now + timedelta(seconds=settings.VERI_BALANCE_GRACE_SECONDS + 60)
    assert tasks.check_jobs(now=after) == {}
    job.refresh_from_db()
    assert job.stop_code == ""
