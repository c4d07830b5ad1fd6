"""A job's "Copy as TOML / CLI / SDK" texts, each fed back to what reads it: the TOML to the CLI's
own parser (`veri run job.toml`), the command lines to bash with the installed `veri`, the SDK
script to Python; each submits, to a live server, a job with the same spec as the first."""

import os
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import pytest

from tests.sdk.test_training_cli import account, dataset_file  # noqa: F401 - the fixture
from training import reuse
from training.models import TrainingJob
from training.services.jobs import Submission, submission_of
from veri_sdk import Client

pytestmark = pytest.mark.django_db(transaction=True)

# Quotes, a backslash, a raw string and non-ASCII text: what the writers must escape.
REWARD = (
    "import re\n\n"
    '# "quoted", a \\ backslash, and ünïcode\n\n'
    "def reward(completions, **kwargs):\n"
    '    return [float(bool(re.search(r"\\d", c))) for c in completions]\n'
)


@pytest.fixture
def source(cli, account, tmp_path) -> TrainingJob:  # noqa: F811
    client = Client(api_key=cli.key, base_url=cli.url)
    data = client.datasets.upload(dataset_file(tmp_path))
    job = client.training_jobs.create(
        base_model="tiny/model",
        dataset_id=data.id,
        validation_dataset=data.id,
        method="grpo",
        reward_source=REWARD,
        output_name="copy-me",
        hyperparameters={"max_steps": 7, "learning_rate": 0.003, "kl_coef": 0.05},
        lora={"r": 8, "dropout": 0.1, "target_modules": ["q_proj", "v_proj"]},
        gpu_type="L4-24GB",
        checkpoint_every=3,
        checkpoint_keep=4,
        max_cost_usd="2.5",
        auto_resume=False,
        max_restarts=1,
    )
    return TrainingJob.objects.get(public_id=job.id)


def same_spec(job: TrainingJob, copy_id: str) -> None:
    copy = TrainingJob.objects.get(public_id=copy_id)
    assert copy.pk != job.pk
    assert asdict(submission_of(copy)) == asdict(submission_of(job))


def newest_other_than(job: TrainingJob) -> str:
    return TrainingJob.objects.exclude(pk=job.pk).order_by("-pk").first().public_id


def test_the_toml_read_by_the_clis_parser_submits_the_same_job(cli, source, tmp_path, capsys):
    folder = tmp_path / "toml"
    folder.mkdir()
    (folder / reuse.TOML_FILE).write_text(reuse.as_toml(submission_of(source)))
    (folder / reuse.REWARD_FILE).write_text(source.reward_source)
    code, out, err = cli("run", str(folder / reuse.TOML_FILE), "--detach", capsys=capsys)
    assert code == 0, err
    same_spec(source, newest_other_than(source))


def shell_env(cli, tmp_path) -> dict:
    venv_bin = str(Path(sys.executable).parent)
    return os.environ | {
        "PATH": f"{venv_bin}:{os.environ['PATH']}",
        "VERI_API_URL": cli.url,
        "VERI_API_KEY": cli.key,
        "XDG_CONFIG_HOME": str(tmp_path / "config"),
    }


def test_the_command_lines_pasted_into_bash_submit_the_same_job(cli, source, tmp_path):
    folder = tmp_path / "cli"
    folder.mkdir()
    lines = reuse.as_cli(submission_of(source))
    done = subprocess.run(
        ["bash", "-e", "-c", lines],
        cwd=folder,
        env=shell_env(cli, tmp_path),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert (folder / reuse.REWARD_FILE).read_text() == REWARD  # written byte for byte
    same_spec(source, newest_other_than(source))


def test_the_sdk_script_run_by_python_submits_the_same_job(cli, source, tmp_path):
    script = reuse.as_sdk(submission_of(source))
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=tmp_path,
        env=shell_env(cli, tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    copy_id, status = done.stdout.split()
    assert status == "queued"
    same_spec(source, copy_id)


@pytest.mark.parametrize("reward", ["x = 1\nVERI_EOF\n", "x = 'a'\ny = 2"])
def test_the_shell_lines_write_a_reward_byte_for_byte(tmp_path, reward):
    """A reward with the here-document's marker as a line, or without a last newline."""
    submission = Submission(base_model="m", dataset_id="ds_x", method="grpo", reward_source=reward)
    writes = reuse.as_cli(submission).rsplit("\nveri run", 1)[0]
    subprocess.run(["bash", "-e", "-c", writes], cwd=tmp_path, check=True)
    assert (tmp_path / reuse.REWARD_FILE).read_text() == reward
