"""Multi-GPU jobs, on CPU: `gpu_count: 2` on the local provider trains data-parallel in two gloo
processes with real TRL, reports one set of metrics, and hands back one adapter; a rank that
dies is a `distributed_error`, one that hangs a `training_stalled`, each rank's last lines in
the log."""

import os
import signal
import statistics

import pytest

from tests.conftest import wait_for
from tests.e2e.test_training import (  # noqa: F401 - platform is a fixture
    GRPO_ROWS,
    SFT_ROWS,
    SHARE_OF_A,
    TINY,
    assert_loads_and_generates,
    download_final,
    metric_series,
    platform,
    submit,
    training_processes,
    wait_settled,
)
from training.models import MetricPoint

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True, serialized_rollback=True)]


def test_two_cpu_processes_train_sft_and_grpo_data_parallel(
    api_client,
    platform,  # noqa: F811
    tiny_model,
    tmp_path,
):
    platform(VERI_LOCAL_SLOTS="1")
    sft = submit(
        api_client,
        SFT_ROWS[:32],
        base_model=TINY,
        method="sft_text",
        gpu_count=2,
        hyperparameters={
            "learning_rate": 5e-3,
            "epochs": 2,
            "batch_size": 8,
            "max_seq_length": 64,
        },
    )
    grpo = submit(
        api_client,
        GRPO_ROWS,
        base_model=TINY,
        method="grpo",
        gpu_count=2,
        reward_source=SHARE_OF_A,
        hyperparameters={
            "learning_rate": 1e-2,
            "max_steps": 6,
            "batch_size": 8,
            "rollouts_per_prompt": 4,
            "max_response_length": 8,
            "kl_coef": 0.0,
        },
    )
    for job_id, steps in ((sft, 8), (grpo, 6)):  # 32 rows / a global batch of 8, twice
        job = wait_settled(job_id, timeout=400)
        assert job.status == "completed", (job.error_code, job.error_message)
        recorded = list(
            MetricPoint.objects.filter(job=job).order_by("step").values_list("step", flat=True)
        )
        assert recorded == list(range(1, steps + 1))  # one set of metrics, from rank 0
        full = api_client.get(f"/v1/training_jobs/{job_id}/logs/full").getvalue().decode()
        assert "hardware check passed: 2 cpu rank(s)" in full
        assert full.count(f"step {steps}/{steps}") == 1
        folder = download_final(api_client, job_id, tmp_path / job_id)
        assert_loads_and_generates(folder, base=tiny_model)
    losses = metric_series(api_client, sft, "loss")
    assert statistics.mean(losses[-3:]) < statistics.mean(losses[:3])


SLOW_SFT = {  # 16 micro-batches a step on each rank: time to act between steps
    "learning_rate": 5e-3,
    "max_steps": 400,
    "batch_size": 32,
    "micro_batch_size": 1,
    "max_seq_length": 64,
}


def test_a_killed_rank_is_a_distributed_error_and_a_hung_one_a_stall(
    api_client,
    platform,  # noqa: F811
):
    platform(VERI_LOCAL_SLOTS="2", VERI_WORKER_STALL_SECONDS="8")
    killed, hung = (
        submit(
            api_client,
            SFT_ROWS,
            base_model=TINY,
            method="sft_text",
            gpu_count=2,
            auto_resume=False,
            hyperparameters=SLOW_SFT,
        )
        for _ in range(2)
    )
    for job_id, sent in ((killed, signal.SIGKILL), (hung, signal.SIGSTOP)):
        wait_for(
            lambda j=job_id: MetricPoint.objects.filter(job__public_id=j, step__gte=2).exists(),
            300,
            f"{job_id} at step 2",
        )
        os.kill(
            training_processes(job_id)[1], sent
        )  # SIGSTOP: alive, but never in the next collective

    job = wait_settled(killed, timeout=200)
    assert (job.status, job.error_code, job.error_attribution) == (
        "failed",
        "distributed_error",
        "pending",
    ), job.error_message
    full = api_client.get(f"/v1/training_jobs/{killed}/logs/full").getvalue().decode()
    assert "the last lines of rank 1:" in full and "[rank 1] step " in full

    job = wait_settled(hung, timeout=200)
    assert (job.status, job.error_code) == ("failed", "training_stalled"), job.error_message
    full = api_client.get(f"/v1/training_jobs/{hung}/logs/full").getvalue().decode()
    assert "Thread 0x" in full  # rank 0's stack, where it waits for rank 1
