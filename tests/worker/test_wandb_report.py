"""The runner's W&B run on its own: offline, what it logs is read back from its `.wandb` file;
online with no way to log in, W&B says so in one line and the job is none the wiser."""

import time

from tests.wandb_files import history, offline_run, records
from worker.wandb_report import WandbRun

SPEC = {
    "job_id": "job_0123456789abcdef",
    "method": "sft",
    "base_model": "volume://models/tiny",
    "hyperparameters": {"learning_rate": 0.001, "max_steps": 3},
    "integrations": [{"type": "wandb", "wandb": {"project": "unit", "tags": ["a"]}}],
    "wandb_mode": "offline",
}


def test_a_failed_job_ends_its_run_with_a_failing_exit_code_and_only_numbers_are_logged(
    tmp_path,
):
    said = []
    run = WandbRun.start(SPEC, key=None, work=tmp_path, say=said.append)
    run.log(1, {"loss": 2.5, "epoch": 0.5, "note": "text", "flag": True})
    run.log(2, {"loss": 1.5})
    run.log(3, {"note": "nothing numeric"})
    run.finish(ok=False)
    assert said == ["[veri] W&B: logging metrics to unit (offline)"]
    wandb_file = offline_run(tmp_path)
    rows = history(wandb_file)
    assert [(r["_step"], r["loss"]) for r in rows] == [(1, 2.5), (2, 1.5)]
    assert "note" not in rows[0] and "flag" not in rows[0]
    [end] = [r.exit for r in records(wandb_file) if r.WhichOneof("record_type") == "exit"]
    assert end.exit_code == 1
    assert (tmp_path / "wandb").stat().st_mode & 0o077 == 0  # the runner's alone


def test_wandb_failing_to_start_is_one_line_and_the_job_goes_on(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc with a key in it
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    said = []
    started = time.monotonic()
    run = WandbRun.start(SPEC | {"wandb_mode": "online"}, key=None, work=tmp_path, say=said.append)
    run.log(1, {"loss": 1.0})
    run.finish(ok=True)
    assert time.monotonic() - started < 30
    assert len(said) == 1 and said[0].startswith("[veri] W&B: not logging this job: "), said


def test_a_job_without_the_integration_has_no_run(tmp_path):
    assert WandbRun.start(SPEC | {"integrations": []}, key="k", work=tmp_path, say=print) is None
    assert not (tmp_path / "wandb").exists()
