"""A real training job with a W&B integration, end to end on the local provider: the runner logs
every metric the training reported to an offline W&B run (read back from its `.wandb` file), and
the workspace's W&B key, handed to the runner, is nowhere the training process can see: not in
its environment, not in its job file, not in W&B's folder."""

import json

import pytest

from tests.e2e.test_training import (  # noqa: F401 - platform is a fixture
    FAST_LORA,
    TINY,
    metric_series,
    platform,
    submit,
    wait_settled,
)
from tests.wandb_files import history, offline_run, run_record
from veri import services as veri_services

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True, serialized_rollback=True)]

KEY = "wandb-canary-5f1d0c7e2b9a4f3c"
# Customer code (a reward function, run in the training process) looks for the key everywhere it
# could: its environment, its job file, W&B's folder next to it, the wandb package; and says what
# it found. (It holds the key written backwards: the job file holds the reward's source.)
SNOOP = f"""
import os, sys
from pathlib import Path

KEY = {KEY[::-1]!r}[::-1]
seen = []

def reward(completions, **kwargs):
    if not seen:
        job_file = Path(sys.argv[1])
        try:
            wandb_dir = str(os.listdir(job_file.parent / "wandb"))
        except OSError as exc:
            wandb_dir = type(exc).__name__
        try:
            import wandb
            package = wandb.__name__
        except ImportError as exc:
            package = type(exc).__name__
        seen.append(1)
        print("SNOOP env=%s jobfile=%s wandb_dir=%s wandb=%s" % (
            any(KEY in v for v in os.environ.values()),
            KEY in job_file.read_text(),
            wandb_dir,
            package,
        ), flush=True)
    return [c.count("a") / max(len(c), 1) for c in completions]
"""
ROWS = [{"prompt": f"Tell me about {w}"} for w in ("cats", "rain", "trains", "music")] * 2


def test_the_runner_logs_the_jobs_metrics_to_wandb_and_keeps_the_key_from_the_training(
    api_client,
    platform,  # noqa: F811 - the fixture imported above
    workspace,
    settings,
):
    settings.VERI_WANDB_MODE = "offline"
    veri_services.set_secret(workspace=workspace, name="WANDB_API_KEY", value=KEY)
    platform()
    job_id = submit(
        api_client,
        ROWS,
        base_model=TINY,
        method="grpo",
        reward_source=SNOOP,
        lora=FAST_LORA,
        hyperparameters={
            "max_steps": 4,
            "batch_size": 8,
            "rollouts_per_prompt": 4,
            "max_response_length": 8,
        },
        integrations=[
            {"type": "wandb", "wandb": {"project": "veri-e2e", "name": "tiny", "tags": ["grpo"]}}
        ],
    )
    job = wait_settled(job_id)
    assert job.status == "completed", (job.error_code, job.error_message)
    full = api_client.get(f"/v1/training_jobs/{job_id}/logs/full").getvalue().decode()
    assert "[veri] W&B: logging metrics to veri-e2e (offline)" in full
    [snoop] = [line for line in full.splitlines() if line.startswith("SNOOP ")]
    assert (
        snoop == "SNOOP env=False jobfile=False wandb_dir=PermissionError wandb=ModuleNotFoundError"
    ), snoop

    work = platform.instances / job_id / "work"
    wandb_file = offline_run(work)
    run = run_record(wandb_file)
    assert (run.project, run.display_name, list(run.tags)) == ("veri-e2e", "tiny", ["grpo"])
    config = {item.key: json.loads(item.value_json) for item in run.config.update}
    assert (config["veri_job_id"], config["method"], config["max_steps"]) == (job_id, "grpo", 4)
    rows = history(wandb_file)
    for name in ("loss", "reward"):
        reported = metric_series(api_client, job_id, name)
        assert len(reported) == 4
        logged = [row[name] for row in rows if name in row]
        assert logged == pytest.approx(reported), name
    assert [row["_step"] for row in rows if "loss" in row] == [1, 2, 3, 4]
    # The key never went further than the runner: no file of the machine, no line of the log.
    assert KEY not in full
    for path in (platform.instances / job_id).rglob("*"):
        if path.is_file():
            assert KEY.encode() not in path.read_bytes(), path
