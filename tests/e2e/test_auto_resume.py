"""Jobs that survive the platform, with real training on the local provider: a job's machine is
killed (or warned and taken away) mid-run; the job restarts on a new machine from its newest
checkpoint, replays the step after it with the same loss, trains on the inputs pinned at submit,
and completes with every step's metrics once, charged for what it kept."""

import json
import os
import signal
import time

import pytest
from django.core.management import call_command

from billing.models import LedgerEntry
from providers.models import Instance
from tests.conftest import fill_volume, wait_for
from tests.e2e.test_training import (  # noqa: F401 - platform is a fixture
    DPO_ROWS,
    FAST_LORA,
    GRPO_ROWS,
    SFT_ROWS,
    SHARE_OF_A,
    TINY,
    platform,
    submit,
    training_processes,
    wait_settled,
)
from training.models import Checkpoint, JobEvent, MetricPoint, TrainingJob

# A reward that takes its time (as one calling a judge model would), so the test can catch the
# job between two checkpoints.
SLOW_SHARE_OF_A = "import time\n" + SHARE_OF_A.replace(
    "    return", "    time.sleep(0.4)\n    return"
)

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True, serialized_rollback=True)]


def host_pid(job_id: str) -> int:
    return int(Instance.objects.get(job__public_id=job_id).external_id.split(":")[0])


def kill_machine_after_checkpoints(job_id: str, count: int) -> int:
    """Kill the job's whole local machine once it has `count` checkpoints and the control plane
    has the step after the newest (what the restarted run replays); returns that checkpoint's
    step. The training is frozen first, so that the worker catches up (uploads what was saved,
    ships what was logged) and nothing lands between the check and the kill."""
    job = TrainingJob.objects.get(public_id=job_id)

    def checkpoints() -> list[int]:
        job.refresh_from_db()
        assert job.finished_at is None, f"the job ended ({job.status}) before it could be killed"
        return sorted(
            Checkpoint.objects.filter(job=job, final=False).values_list("step", flat=True)
        )

    wait_for(lambda: len(checkpoints()) >= count, 300, f"{count} checkpoints")
    for _ in range(20):
        training = training_processes(job_id)
        for pid in training.values():
            os.kill(pid, signal.SIGSTOP)
        caught_up = time.monotonic() + 5  # the worker ships what was logged every second
        while time.monotonic() < caught_up:
            time.sleep(0.5)
            newest = checkpoints()[-1]
            if MetricPoint.objects.filter(job=job, step=newest + 1).exists():
                time.sleep(1)  # a checkpoint upload still in flight lands, or not, now
                if checkpoints()[-1] == newest:
                    os.killpg(host_pid(job_id), signal.SIGKILL)  # the machine, worker and all
                    return newest
        for pid in training.values():  # frozen right at a checkpoint: one more step
            os.kill(pid, signal.SIGCONT)
        wait_for(
            lambda: MetricPoint.objects.filter(job=job, step__gt=checkpoints()[-1]).exists(),
            60,
            "the step after the checkpoint",
        )
    raise AssertionError("never caught the job with the step after its checkpoint reported")


def assert_restarted_once_and_completed(api_client, job_id: str, *, cause: str, from_step: int):
    """The job's one restart, its replayed step, its metrics and its money, as a user sees them."""
    job = wait_settled(job_id, timeout=420)
    assert job.status == "completed", (job.error_code, job.error_message)
    assert job.attempt == 2
    [restarted] = JobEvent.objects.filter(job=job, type="job_restarted")
    assert (restarted.detail["cause"], restarted.detail["from_step"]) == (cause, from_step)
    max_steps = job.hyperparameters["max_steps"]
    steps = list(
        MetricPoint.objects.filter(job=job).order_by("step").values_list("step", flat=True)
    )
    assert steps == list(range(1, max_steps + 1))  # no gap, no step twice
    full = api_client.get(f"/v1/training_jobs/{job_id}/logs/full").getvalue().decode()
    assert full.count(f"step {max_steps}/{max_steps}") == 1
    got = api_client.get(f"/v1/training_jobs/{job_id}").json()
    [run] = got["restarts"]
    assert (run["attempt"], run["cause"]) == (1, cause)
    credit = LedgerEntry.objects.get(job=job, kind="refund_credit")
    assert credit.amount_micros == job.attempts.get().lost_micros > 0
    assert (
        LedgerEntry.objects.get(job=job, kind="job_charge").amount_micros
        == -job.billing.cost_micros
    )
    return job, full


def assert_replay_verified(job: TrainingJob, step: int) -> dict:
    [verified] = JobEvent.objects.filter(job=job, type__in=["resume_verified", "resume_mismatch"])
    assert (verified.type, verified.detail["step"]) == ("resume_verified", step), verified.detail
    print(f"\n{job.method}: replayed step {verified.detail}")
    return verified.detail


def test_killed_sft_machines_resume_at_their_checkpoint_on_pinned_inputs_or_from_zero(
    api_client,
    platform,  # noqa: F811
    workspace,
):
    """Two jobs on one platform: one killed before any checkpoint; then one killed after its
    second checkpoint, with its dataset replaced in the volume meanwhile."""
    platform(VERI_WATCH_PERIOD_SECONDS="1", VERI_LOCAL_SLOTS="2")
    rows = "".join(json.dumps(row) + "\n" for row in SFT_ROWS * 4).encode()
    fill_volume(workspace, "corpus", {"train.jsonl": rows})
    dataset = api_client.post(
        "/v1/datasets",
        {"source": "volume", "volume": "corpus", "path": "train.jsonl"},
        format="json",
    ).json()
    slow = {  # 16 micro-batches a step: slow enough to be caught mid-run
        "learning_rate": 5e-3,
        "max_steps": 30,
        "batch_size": 16,
        "micro_batch_size": 1,
        "max_seq_length": 64,
    }
    no_checkpoint = submit(
        api_client, SFT_ROWS, base_model=TINY, method="sft_text", hyperparameters=slow
    )
    wait_for(
        lambda: MetricPoint.objects.filter(job__public_id=no_checkpoint, step__gte=3).exists(),
        300,
        "step 3",
    )
    os.killpg(host_pid(no_checkpoint), signal.SIGKILL)
    pinned = submit(
        api_client,
        [],
        dataset_id=dataset["id"],
        base_model=TINY,
        method="sft_text",
        checkpoint_every=8,
        hyperparameters=slow | {"max_steps": 48},  # killed past step 16: 32 steps to spare
    )
    wait_for(lambda: Checkpoint.objects.filter(job__public_id=pinned).exists(), 300, "a checkpoint")
    # Replaced while the job runs with a file no run could train on: a restart that read the
    # volume rather than the job's pinned inputs would fail with invalid_dataset.
    fill_volume(workspace, "corpus", {"train.jsonl": b"not json\n"})
    newest = kill_machine_after_checkpoints(pinned, count=2)

    job, full = assert_restarted_once_and_completed(
        api_client, pinned, cause="worker_failed", from_step=newest
    )
    assert f"at step {newest}" in full
    assert_replay_verified(job, newest + 1)
    restarts = api_client.get(f"/v1/training_jobs/{pinned}").json()["restarts"]
    assert restarts[0]["checkpoint_step"] == newest

    job, full = assert_restarted_once_and_completed(
        api_client, no_checkpoint, cause="worker_failed", from_step=0
    )
    assert "resuming from" not in full
    assert job.attempts.get().kept_micros == 0  # nothing kept: all of that run is credited
    assert not JobEvent.objects.filter(job=job, type__startswith="resume_").exists()


def test_a_killed_grpo_machine_and_a_preempted_dpo_one_resume_where_they_were(
    api_client,
    platform,  # noqa: F811
    settings,
):
    """Side by side: a GRPO job's machine killed after its second checkpoint; a DPO job (no
    checkpoint_every) warned of a preemption, whose checkpoint is then the notice's."""
    platform(
        VERI_WATCH_PERIOD_SECONDS="1", VERI_WORKER_NOTICE_POLL_SECONDS="0.5", VERI_LOCAL_SLOTS="2"
    )
    settings.VERI_LOCAL_INSTANCES_DIR = str(platform.instances)
    dpo = submit(
        api_client,
        DPO_ROWS,
        base_model=TINY,
        method="dpo",
        hyperparameters={
            "learning_rate": 5e-3,
            "max_steps": 150,
            "batch_size": 2,
            "max_seq_length": 64,
        },
    )
    grpo = submit(
        api_client,
        GRPO_ROWS,
        base_model=TINY,
        method="grpo",
        reward_source=SLOW_SHARE_OF_A,
        checkpoint_every=5,
        hyperparameters={
            "learning_rate": 1e-2,
            "max_steps": 16,
            "batch_size": 8,
            "rollouts_per_prompt": 4,
            "max_response_length": 8,
            "kl_coef": 0.0,
        },
    )
    wait_for(
        lambda: MetricPoint.objects.filter(job__public_id=dpo, step__gte=3).exists(), 300, "step 3"
    )
    call_command("simulate_preemption", dpo, seconds=10)
    newest = kill_machine_after_checkpoints(grpo, count=2)
    flushed = wait_for(
        lambda: (
            Checkpoint.objects.filter(job__public_id=dpo).values_list("step", flat=True).first()
        ),
        30,
        "the notice's checkpoint",
    )

    job, _ = assert_restarted_once_and_completed(
        api_client, grpo, cause="worker_failed", from_step=newest
    )
    replayed = assert_replay_verified(job, newest + 1)
    assert "reward_now" in replayed  # the same completions sampled again: the RNG was restored

    job, full = assert_restarted_once_and_completed(
        api_client, dpo, cause="provider_reclaimed", from_step=flushed
    )
    [notice] = JobEvent.objects.filter(job=job, type="preemption_notice")
    assert notice.detail["source"] == "local" and notice.detail["terminates_at"]
    assert "warned that this machine goes away" in full
    assert f"checkpoint {flushed} holds the progress; training paused" in full
    assert_replay_verified(job, flushed + 1)
