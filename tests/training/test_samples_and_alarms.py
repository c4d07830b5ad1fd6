"""GRPO samples the worker sends, and the alarms the control plane raises from what it gets."""

import pytest

from tests.training.conftest import drive, worker_client
from training import tasks
from training.models import JobEvent, Sample

pytestmark = pytest.mark.django_db


@pytest.fixture
def running(submit):
    job = submit()
    tasks.provision_job(job_id=job.pk)
    job = drive(job, "configuring", "running")
    return job, worker_client(job)


def events(job) -> list[str]:
    return list(JobEvent.objects.filter(job=job).values_list("type", flat=True))


def send_samples(worker, job, step: int, completions: list[str]):
    samples = [
        {
            "step": step,
            "index": i,
            "prompt": "What is 2 + 2?",
            "completion": text,
            "reward": float(text == "4"),
            "rewards": {"correct": float(text == "4"), "short": 0.0},
        }
        for i, text in enumerate(completions)
    ]
    return worker.post(
        f"/v1/worker/jobs/{job.public_id}/samples", {"samples": samples}, format="json"
    )


def test_samples_are_listed_by_step_with_each_rewards_share(running, api_client):
    job, worker = running
    assert send_samples(worker, job, 10, ["4", "5"]).json()["added"] == 2
    assert send_samples(worker, job, 10, ["4", "5"]).json()["added"] == 0  # resent
    listed = api_client.get(f"/v1/training_jobs/{job.public_id}/samples").json()["data"]
    assert [(s["step"], s["completion"], s["reward"]) for s in listed] == [
        (10, "4", 1.0),
        (10, "5", 0.0),
    ]
    assert listed[0]["rewards"] == {"correct": 1.0, "short": 0.0}


def test_completions_collapsing_to_one_string_raise_an_alarm_once(running, api_client):
    job, worker = running
    send_samples(worker, job, 10, ["4", "5", "6", "4"])
    for step in (20, 30, 40):
        send_samples(worker, job, step, ["4"] * 4)
    assert events(job).count("alarm_completions_collapsed") == 1
    listed = api_client.get(f"/v1/training_jobs/{job.public_id}/events").json()["data"]
    alarm = next(e for e in listed if e["type"] == "alarm_completions_collapsed")
    assert alarm["detail"]["completion"] == "4"


def test_a_flat_reward_and_a_rising_kl_raise_alarms(running, settings):
    settings.VERI_ALARM_FLAT_STEPS = 5
    settings.VERI_ALARM_KL_MAX = 0.5
    job, worker = running
    url = f"/v1/worker/jobs/{job.public_id}/metrics"
    moving = [{"step": s, "values": {"reward": s / 10, "kl": 0.01}} for s in range(1, 6)]
    worker.post(url, {"points": moving}, format="json")
    assert "alarm_reward_flat" not in events(job)
    flat = [{"step": s, "values": {"reward": 0.25, "kl": 0.2 * (s - 5)}} for s in range(6, 11)]
    worker.post(url, {"points": flat}, format="json")
    assert events(job).count("alarm_reward_flat") == 1
    assert events(job).count("alarm_kl_high") == 1
    more = [{"step": s, "values": {"reward": 0.25, "kl": 2.0}} for s in range(11, 14)]
    worker.post(url, {"points": more}, format="json")
    assert events(job).count("alarm_reward_flat") == 1  # once per job
    assert Sample.objects.count() == 0
