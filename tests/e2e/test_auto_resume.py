"""Auto-resume with real training: the local machine of a running job is killed; the job restarts
on a new machine from its newest checkpoint, replays the step after it with the same loss, and
completes with every step's metrics once."""

import os
import signal
import time

import pytest

from billing.models import LedgerEntry
from providers.models import Instance
from tests.conftest import wait_for
from tests.e2e.test_training import (  # noqa: F401 - platform is a fixture
    FAST_LORA,
    SFT_ROWS,
    TINY,
    platform,
    submit,
    wait_settled,
)
from training.models import Checkpoint, JobEvent, MetricPoint, TrainingJob

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True, serialized_rollback=True)]


def kill_machine_between_checkpoints(job_id: str, every: int) -> int:
    """Kill the job's whole local machine once it has two checkpoints and trained two or three
    steps past the newest (so the step after it was reported); returns that checkpoint's step."""

    def ready():
        job = TrainingJob.objects.get(public_id=job_id)
        steps = sorted(Checkpoint.objects.filter(job=job).values_list("step", flat=True))
        past = (job.last_step or 0) - (steps[-1] if steps else 0)
        return len(steps) >= 2 and 2 <= past < every and steps[-1]

    newest = wait_for(ready, 240, "two checkpoints and two steps past the newest")
    host = int(Instance.objects.get(job__public_id=job_id).external_id.split(":")[0])
    os.killpg(host, signal.SIGKILL)  # the machine is gone, worker and all
    return newest


def test_a_killed_sft_machine_restarts_from_its_checkpoint_and_completes(
    api_client,
    platform,  # noqa: F811
    tiny_model,
):
    platform(VERI_WATCH_PERIOD_SECONDS="1", VERI_LOCAL_SLOTS="1")
    job_id = submit(
        api_client,
        SFT_ROWS * 4,
        base_model=TINY,
        method="sft_text",
        lora=FAST_LORA,
        checkpoint_every=5,
        hyperparameters={
            "learning_rate": 5e-3,
            "max_steps": 40,
            "batch_size": 2,
            "max_seq_length": 64,
        },
    )
    newest = kill_machine_between_checkpoints(job_id, every=5)
    killed = time.monotonic()
    job = wait_settled(job_id, timeout=300)
    assert job.status == "completed", (job.error_code, job.error_message)
    assert job.attempt == 2

    restarted = JobEvent.objects.get(job=job, type="job_restarted").detail
    assert (restarted["cause"], restarted["from_step"]) == ("worker_failed", newest)
    verified = JobEvent.objects.get(job=job, type="resume_verified").detail
    assert verified["step"] == newest + 1
    print(
        f"\nrestarted {time.monotonic() - killed:.0f} s after the kill; step {verified['step']} "
        f"loss {verified['loss_before']} before, {verified['loss_now']} after the restart"
    )
    steps = list(
        MetricPoint.objects.filter(job=job).order_by("step").values_list("step", flat=True)
    )
    assert steps == list(range(1, 41))  # no gap, no step twice
    full = api_client.get(f"/v1/training_jobs/{job_id}/logs/full").content.decode()
    assert "resuming from" in full and f"at step {newest}" in full
    assert full.count("step 40/40") == 1

    got = api_client.get(f"/v1/training_jobs/{job_id}").json()
    [run] = got["restarts"]
    assert (run["attempt"], run["cause"], run["checkpoint_step"]) == (1, "worker_failed", newest)
    credit = LedgerEntry.objects.get(job=job, kind="refund_credit")
    assert credit.amount_micros == job.attempts.get().lost_micros
    assert LedgerEntry.objects.get(job=job, kind="job_charge").amount_micros == -job.cost_micros
