"""The SDK and CLI for training against a live server: logs as the seed says, wait() through a
failing log stream, a submit retried after a dropped connection, an interrupted download resumed
and verified, the local reward check, and job files (TOML and @training_job)."""

import contextlib
import hashlib
import io
import json
import os
import signal
import threading
import time

import pytest
from django.utils import timezone

from billing.services import open_billing_account
from tests.conftest import put_to_url
from tests.sdk.faults import FaultyProxy
from tests.training.conftest import GRPO_ROWS, REWARD, worker_client
from training import tasks
from training.models import TrainingJob
from training.services import jobs
from veri_sdk import (
    Client,
    ConflictError,
    InsufficientBalanceError,
    InvalidRewardError,
    NotFoundError,
)
from veri_sdk.cli import main
from veri_sdk.training import DownloadFailed
from worker.runner import registration

pytestmark = pytest.mark.django_db(transaction=True)

BAD_REWARDS = {
    "raises": "def reward(completions, **kw):\n    raise ValueError('boom')\n",
    "wrong_count": "def reward(completions, **kw):\n    return [1.0]\n",
    "not_numbers": "def reward(completions, **kw):\n    return ['high' for c in completions]\n",
}


@pytest.fixture
def account(cli, cloud, settings, tmp_path):
    """The CLI's workspace with money, a local store, and the fake cloud as the default."""
    settings.VERI_STORE = f"file://{tmp_path / 'store'}"
    open_billing_account(workspace=cli.workspace, credit_micros=100_000_000)
    return cli.workspace


@pytest.fixture
def proxy(live_server, settings):
    """A faulty network in front of the live server: the address clients reach the API at, so
    the local store's signed URLs point at it too."""
    proxy = FaultyProxy(live_server.url)
    settings.VERI_PUBLIC_URL = proxy.url
    yield proxy
    proxy.close()


def dataset_file(tmp_path, rows=GRPO_ROWS) -> str:
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def job_fields(client: Client, tmp_path, **fields) -> dict:
    """A small GRPO job's submit arguments, its dataset uploaded; `fields` added or replaced."""
    dataset = client.datasets.upload(dataset_file(tmp_path))
    return {
        "base_model": "tiny/model",
        "dataset_id": dataset.id,
        "method": "grpo",
        "reward_source": REWARD,
        "gpu_type": "L4-24GB",
        "hyperparameters": {"max_steps": 5},
    } | fields


def submit(client: Client, tmp_path, **fields) -> str:
    return client.training_jobs.create(**job_fields(client, tmp_path, **fields)).id


def run_worker(
    job_id: str,
    lines: int,
    *,
    pause: float = 0.0,
    final_files: dict | None = None,
    error_code: str | None = None,
):
    """What a worker does for a job, in a thread: register, run, log, complete (or fail with
    `error_code`); then settle."""
    job = TrainingJob.objects.get(public_id=job_id)
    tasks.provision_job(job_id=job.pk)
    job.refresh_from_db()
    worker = worker_client(job)
    base = f"/v1/worker/jobs/{job_id}"
    worker.post(f"{base}/register", registration(), format="json")
    worker.post(f"{base}/status", {"status": "running"}, format="json")
    for seq in range(lines):
        worker.post(f"{base}/logs", {"lines": [{"seq": seq, "text": f"line {seq}"}]}, format="json")
        time.sleep(pause)
    if final_files:
        paths = [f"final/{name}" for name in final_files]
        answer = worker.post(f"{base}/output-credentials", {"paths": paths}, format="json").json()
        for entry, data in zip(answer["files"], final_files.values(), strict=True):
            put_to_url(worker, entry["url"], data)
        worker.post(
            f"{base}/checkpoints",
            {
                "step": 5,
                "final": True,
                "files": [
                    {"path": name, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
                    for name, data in final_files.items()
                ],
            },
            format="json",
        )
    ending = {"ok": False, "error_code": error_code} if error_code else {"ok": True}
    worker.post(f"{base}/complete", ending, format="json")
    tasks.settle_job(job_id=job.pk)


def in_background(work) -> threading.Thread:
    from django.db import connection

    def run():
        try:
            work()
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_jobs_logs_as_the_seed_says(cli, capsys, account, tmp_path):
    queued = submit(Client(), tmp_path)
    code, out, _ = cli("jobs", "logs", queued, capsys=capsys)
    assert (code, out.strip()) == (0, "[no logs available yet]")
    job = TrainingJob.objects.get(public_id=queued)
    jobs.fail_job(job_id=job.pk, code="CAPACITY_UNAVAILABLE")
    tasks.settle_job(job_id=job.pk)
    code, _, err = cli("jobs", "logs", queued, capsys=capsys)
    assert code == 1 and "log was never uploaded for this job" in err


def test_jobs_logs_follow_prints_lines_until_the_job_ends(cli, capsys, account, tmp_path):
    job_id = submit(Client(), tmp_path)
    worker = in_background(lambda: run_worker(job_id, lines=6, pause=0.3))
    code, out, _ = cli("jobs", "logs", job_id, "-f", capsys=capsys)
    worker.join()
    assert code == 0
    assert [line for line in out.splitlines() if line.startswith("line ")] == [
        f"line {i}" for i in range(6)
    ]
    code, out, _ = cli("jobs", "get", job_id, "--json", capsys=capsys)
    assert code == 0 and json.loads(out)["status"] == "completed"
    code, out, _ = cli("jobs", "get", job_id, capsys=capsys)
    assert out.splitlines()[0].split() == ["id", job_id]  # no blank header row above it


def test_jobs_logs_follow_exits_1_when_the_job_fails_or_was_cancelled(
    cli, capsys, account, tmp_path
):
    job_id = submit(Client(), tmp_path)
    worker = in_background(lambda: run_worker(job_id, lines=3, error_code="training_error"))
    code, out, err = cli("jobs", "logs", job_id, "-f", capsys=capsys)
    worker.join()
    assert code == 1 and "line 2" in out
    assert f"error: {job_id} failed: training_error (customer)" in err
    assert cli("jobs", "logs", job_id, capsys=capsys)[0] == 0  # reading a log is no failure

    cancelled = submit(Client(), tmp_path)
    Client().training_jobs.cancel(cancelled)
    code, _, err = cli("jobs", "logs", cancelled, "-f", capsys=capsys)
    assert code == 1 and f"{cancelled} ended cancelled" in err


@contextlib.contextmanager
def interrupt_after(seconds: float):
    """Ctrl+C in this process (pytest's main thread, where the CLI runs) after `seconds`, unless
    the block ended first."""
    timer = threading.Timer(seconds, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


def test_ctrl_c_while_following_says_the_job_goes_on_and_how_to_follow_it_again(
    cli, capsys, account, tmp_path
):
    job_id = submit(Client(), tmp_path)  # queued: nothing runs it, so following never ends
    with interrupt_after(1.5):
        code, _, err = cli("jobs", "logs", job_id, "-f", capsys=capsys)
    assert code == 130
    assert f"{job_id} keeps running" in err and f"veri jobs logs -f {job_id}" in err

    (tmp_path / "reward.py").write_text(REWARD)
    dataset_file(tmp_path)
    (tmp_path / "job.toml").write_text(
        'kind = "train"\nbase_model = "tiny/model"\ndataset = "train.jsonl"\n'
        'method = "grpo"\nreward = "reward.py"\ngpu_type = "L4-24GB"\n'
    )
    with interrupt_after(1.5):
        code, out, err = cli("run", str(tmp_path / "job.toml"), "--no-check", capsys=capsys)
    submitted = TrainingJob.objects.latest("created_at").public_id
    assert code == 130 and f"Submitted {submitted}" in out, err
    assert f"veri jobs logs -f {submitted}" in err
    assert Client().training_jobs.get(submitted).status == "queued"  # detached, not cancelled


def test_wait_returns_the_finished_job_when_the_log_stream_fails_midway(
    cli, account, tmp_path, proxy
):
    client = Client(base_url=proxy.url, max_retries=0)
    job_id = submit(client, tmp_path)
    proxy.add("/logs?", "status", status=503, times=10_000, after=2)  # then every one fails
    worker = in_background(lambda: run_worker(job_id, lines=4, pause=0.4))
    printed = io.StringIO()
    job = client.training_jobs.get(job_id).wait(poll_interval=0.5, out=printed)
    worker.join()
    assert job.status == "completed" and job.cost_usd is not None
    assert proxy.count("/logs?") > 2  # it kept asking, failed, and polled on quietly


def test_a_submit_retried_after_a_dropped_connection_makes_one_job(account, tmp_path, proxy):
    client = Client(base_url=proxy.url)
    dataset = client.datasets.upload(dataset_file(tmp_path))
    proxy.add("/v1/training_jobs", "drop")  # the server makes the job; the answer is lost
    job = client.training_jobs.create(
        base_model="tiny/model",
        dataset_id=dataset.id,
        method="grpo",
        reward_source=REWARD,
        gpu_type="L4-24GB",
        hyperparameters={"max_steps": 5},
    )
    assert proxy.count("/v1/training_jobs", "POST") == 2
    assert list(TrainingJob.objects.values_list("public_id", flat=True)) == [job.id]


def test_an_interrupted_download_resumes_and_verifies(account, tmp_path, proxy):
    files = {
        "adapter_config.json": b'{"r": 8}',
        "adapter_model.safetensors": bytes(range(256)) * 4096,
        "tokenizer.json": b'{"model": "bpe"}',
    }
    client = Client(base_url=proxy.url, max_retries=0)
    job_id = submit(client, tmp_path)
    run_worker(job_id, lines=1, final_files=files)
    proxy.add("/v1/store/", "cut", after=1)  # the second file's body is cut halfway
    with pytest.raises(Exception, match="object store"):
        client.training_jobs.download(job_id, output_dir=tmp_path / "out")
    folder = tmp_path / "out" / job_id
    assert not (folder / "adapter_model.safetensors").exists()  # never a half-written file
    fetched_before = proxy.count("/v1/store/")
    assert client.training_jobs.get(job_id).download(tmp_path / "out") == folder
    assert proxy.count("/v1/store/") - fetched_before == 2  # only what was missing
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == files
    (folder / "tokenizer.json").write_bytes(b'{"model": "tampered"}')  # same size, other bytes
    fetched_before = proxy.count("/v1/store/")
    client.training_jobs.download(job_id, output_dir=tmp_path / "out")
    assert proxy.count("/v1/store/") - fetched_before == 1
    assert (folder / "tokenizer.json").read_bytes() == files["tokenizer.json"]


def test_a_second_download_says_it_skipped_the_files_already_there(cli, capsys, account, tmp_path):
    files = {"adapter_config.json": b'{"r": 8}', "tokenizer.json": b'{"model": "bpe"}'}
    job_id = submit(Client(), tmp_path)
    run_worker(job_id, lines=1, final_files=files)
    output = str(tmp_path / "out")
    code, out, _ = cli("jobs", "download", job_id, "-o", output, capsys=capsys)
    assert code == 0 and "Downloaded 2 file(s)" in out and "skipped" not in out
    code, out, _ = cli("jobs", "download", job_id, "-o", output, capsys=capsys)
    assert code == 0 and "All 2 file(s)" in out and "nothing downloaded" in out
    (tmp_path / "out" / job_id / "tokenizer.json").unlink()
    code, out, _ = cli("jobs", "download", job_id, "-o", output, capsys=capsys)
    assert "Downloaded 1 file(s)" in out and "skipped 1 already there" in out


def test_a_download_that_arrives_different_is_refused(account, tmp_path, live_server):
    files = {"adapter_config.json": b'{"r": 8}'}
    client = Client()
    job_id = submit(client, tmp_path)
    run_worker(job_id, lines=1, final_files=files)
    checkpoint = TrainingJob.objects.get(public_id=job_id).checkpoints.get()
    checkpoint.files = [dict(checkpoint.files[0], sha256="0" * 64)]
    checkpoint.save(update_fields=["files"])
    with pytest.raises(DownloadFailed, match="sha256"):
        client.training_jobs.download(job_id, output_dir=tmp_path / "out")
    assert not (tmp_path / "out" / job_id / "adapter_config.json").exists()


def test_errors_are_typed_by_code(account, cli, tmp_path):
    client = Client()
    dataset = client.datasets.upload(dataset_file(tmp_path))
    with pytest.raises(InvalidRewardError) as bad:
        client.training_jobs.create(
            base_model="tiny/model",
            dataset_id=dataset.id,
            method="grpo",
            reward_source="def reward(:",
            gpu_type="L4-24GB",
        )
    assert bad.value.code == "invalid_reward" and bad.value.field == "reward_source"
    with pytest.raises(NotFoundError):
        client.training_jobs.get("job_missing")
    from billing import services as billing

    billing.record_entry(
        workspace=account,
        kind="adjustment",
        amount_micros=-billing.balance_micros(workspace=account),
        key="test:empty",
    )
    with pytest.raises(InsufficientBalanceError):
        submit(client, tmp_path)


def test_catalog_and_lists_from_the_cli(cli, capsys, account, tmp_path):
    code, out, _ = cli("regions", "list", capsys=capsys)
    assert code == 0 and "us-east-1" in out and "default" in out and "coming soon" in out
    code, out, _ = cli("gpu", "list", capsys=capsys)
    assert code == 0 and "L4-24GB" in out and "0.805" in out
    assert "GPUS/JOB" in out.splitlines()[0]  # per job, not the local provider's slots
    code, out, _ = cli("gpu", "list", "--provider", "local", "--json", capsys=capsys)
    local = json.loads(out)
    assert code == 0 and "us-east-1" in local[0]["available_regions"]
    code, out, _ = cli("gpu", "list", "--provider", "gcp", capsys=capsys)  # no gcp here
    assert code == 0 and "none" not in out and "not configured here" in out
    assert "gcp is not configured on this deployment; the providers that are: local, aws." in out
    code, out, _ = cli("datasets", "upload", dataset_file(tmp_path), capsys=capsys)
    assert code == 0 and "8 rows" in out
    code, out, _ = cli("datasets", "list", "--json", capsys=capsys)
    assert code == 0 and json.loads(out)[0]["row_count"] == 8
    job_id = submit(Client(), tmp_path)
    code, out, _ = cli("jobs", "list", capsys=capsys)
    assert code == 0 and job_id in out
    code, out, _ = cli("jobs", "cancel", job_id, capsys=capsys)
    assert code == 0 and "cancelled" in out


@pytest.mark.parametrize("case", ["good", *BAD_REWARDS])
def test_rewards_test_runs_the_reward_here(capsys, tmp_path, case):
    reward = tmp_path / "reward.py"
    reward.write_text(
        BAD_REWARDS.get(
            case, "def reward(completions, **kw):\n    return [0.5 for c in completions]\n"
        )
    )
    code = main(["rewards", "test", str(reward), "--dataset", dataset_file(tmp_path), "-n", "8"])
    captured = capsys.readouterr()
    if case == "good":
        assert code == 0 and "usable" in captured.out and "What is 1 + 1?" in captured.out
    else:
        assert code == 1
        expected = {
            "raises": "ValueError: boom",
            "wrong_count": "1 scores for 8",
            "not_numbers": "not a number",
        }[case]
        assert expected in captured.err


def test_a_reward_that_hangs_is_stopped(capsys, tmp_path, monkeypatch):
    from veri_sdk.cli import train

    monkeypatch.setattr(train, "CHECK_TIMEOUT_SECONDS", 2)
    reward = tmp_path / "reward.py"
    reward.write_text("import time\ndef reward(completions, **kw):\n    time.sleep(60)\n")
    assert main(["rewards", "test", str(reward)]) == 1
    assert "did not return within 2 s" in capsys.readouterr().err


@pytest.mark.parametrize("case", list(BAD_REWARDS))
def test_veri_train_refuses_a_bad_reward_before_renting(cli, capsys, account, tmp_path, case):
    job_file = tmp_path / "job.py"
    body = BAD_REWARDS[case].replace("def reward(", "def score(")
    job_file.write_text(
        "from veri_sdk import training_job\n\n"
        "@training_job(base_model='tiny/model', dataset='train.jsonl', gpu_type='L4-24GB')\n" + body
    )
    dataset_file(tmp_path)
    code, _, err = cli("train", str(job_file), capsys=capsys)
    assert code == 1 and "Not submitted" in err
    assert not TrainingJob.objects.exists()


@pytest.mark.parametrize(
    "text, named",
    [
        (
            'kind = "train"\nbase_model = "m"\ndataset = "d.jsonl"\nlearning_rte = 0.1\n',
            "'learning_rte' (line 4)",
        ),
        (
            'kind = "train"\nbase_model = "m"\ndataset = "d.jsonl"\ngpu_count = "two"\n',
            "'gpu_count' must be a whole number",
        ),
        ('kind = "train"\nbase_model = "m"\n', "'dataset' is missing"),
        ('kind = "serve"\nbase_model = "m"\ndataset = "d.jsonl"\n', 'kind must be "train"'),
        ('kind = "train"\nbase_model = \n', "Invalid value"),
    ],
)
def test_veri_run_names_the_key_it_cannot_take(capsys, tmp_path, text, named):
    config = tmp_path / "job.toml"
    config.write_text(text)
    assert main(["--api-key", "veri_sk_x_y", "run", str(config)]) == 2
    assert named in capsys.readouterr().err


def test_veri_train_submits_a_decorated_reward_and_detaches(cli, capsys, account, tmp_path):
    job_file = tmp_path / "job.py"
    job_file.write_text(
        "from veri_sdk import training_job\n\n"
        "@training_job(base_model='tiny/model', dataset='train.jsonl', gpu_type='L4-24GB',\n"
        "              hyperparameters={'max_steps': 3}, output_name='decorated')\n"
        "def score(completions, **kwargs):\n"
        "    return [float('4' in c) for c in completions]\n"
    )
    dataset_file(tmp_path)
    code, out, _ = cli("train", str(job_file), "--detach", "--region", "us-east-1", capsys=capsys)
    assert code == 0 and "Submitted job_" in out and "usable" in out
    job = TrainingJob.objects.get()
    assert (job.output_name, job.hyperparameters["max_steps"], job.region) == (
        "decorated",
        3,
        "us-east-1",
    )
    assert "@training_job" in job.reward_source  # the whole module is the reward source
    assert job.created_at <= timezone.now()
    assert f"Uploaded {tmp_path / 'train.jsonl'} as {job.dataset.public_id}" in out
    # Submitted again: the same bytes are the same dataset, and the command says so.
    code, out, _ = cli("train", str(job_file), "--detach", capsys=capsys)
    assert code == 0 and f"Using {job.dataset.public_id} (" in out and "the same bytes as" in out


def test_a_validation_dataset_from_the_sdk_and_from_a_job_file(cli, capsys, account, tmp_path):
    client = Client()
    validation = client.datasets.upload(dataset_file(tmp_path))
    job_id = submit(client, tmp_path, validation_dataset=validation)  # a Dataset, or its id
    assert client.training_jobs.get(job_id).data["validation_dataset_id"] == validation.id

    (tmp_path / "valid.jsonl").write_text(json.dumps(GRPO_ROWS[0]) + "\n")
    (tmp_path / "reward.py").write_text(REWARD)
    (tmp_path / "job.toml").write_text(
        'kind = "train"\nbase_model = "tiny/model"\ndataset = "train.jsonl"\n'
        'validation_dataset = "valid.jsonl"\nmethod = "grpo"\nreward = "reward.py"\n'
        'gpu_type = "L4-24GB"\n'
    )
    code, out, err = cli("run", str(tmp_path / "job.toml"), "--detach", "--no-check", capsys=capsys)
    assert code == 0, out + err
    job = TrainingJob.objects.select_related("validation_dataset").latest("created_at")
    assert (job.validation_dataset.row_count, job.dataset.row_count) == (1, len(GRPO_ROWS))


def test_datasets_dedup_preview_and_delete_from_the_sdk_and_cli(cli, capsys, account, tmp_path):
    client = Client()
    first = client.datasets.upload(dataset_file(tmp_path))
    assert first.created
    code, out, _ = cli("datasets", "upload", dataset_file(tmp_path), capsys=capsys)
    assert code == 0 and out.split()[0] == first.id  # the same bytes: the same dataset
    assert "reused: this workspace already had these bytes" in " ".join(out.split()), out
    again = client.datasets.upload(dataset_file(tmp_path))
    assert again.id == first.id and not again.created
    assert first.preview(rows=2) == GRPO_ROWS[:2]
    code, out, _ = cli("datasets", "preview", first.id, capsys=capsys)
    assert code == 0 and [json.loads(line) for line in out.splitlines()] == GRPO_ROWS[:5]
    job_id = submit(client, tmp_path)
    with pytest.raises(ConflictError, match=job_id):
        first.delete()
    code, _, err = cli("datasets", "delete", first.id, capsys=capsys)
    assert code != 0 and job_id in err
    TrainingJob.objects.filter(public_id=job_id).delete()
    code, out, _ = cli("datasets", "delete", first.id, capsys=capsys)
    assert code == 0 and first.id in out
    with pytest.raises(NotFoundError):
        client.datasets.get(first.id)


def test_jobs_get_names_a_finished_jobs_checkpoint_and_how_to_deploy_it(
    cli, capsys, account, tmp_path
):
    job_id = submit(Client(), tmp_path)
    code, out, _ = cli("jobs", "get", job_id, capsys=capsys)
    assert code == 0 and "checkpoint" not in out  # queued: nothing to deploy yet
    run_worker(job_id, lines=1, final_files={"adapter_config.json": b'{"r": 8}'})
    [final] = [c for c in Client().training_jobs.checkpoints(job_id) if c["final"]]
    code, out, _ = cli("jobs", "get", job_id, capsys=capsys)
    assert code == 0
    assert f"checkpoint  {final['id']} (final; serve it: veri deploy {job_id})" in out
