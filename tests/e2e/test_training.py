"""Real training end to end: jobs submitted through /v1, launched by a real qcluster on the local
provider, trained by the real worker with TRL on a tiny model made here, checkpoints loaded back
with transformers/peft."""

import contextlib
import json
import os
import signal
import statistics
import subprocess
import time
from datetime import datetime
from pathlib import Path

import pytest

from billing.models import LedgerEntry
from billing.services import open_billing_account
from providers.models import Instance
from tests import model_python
from tests.conftest import REPO, fill_volume, get_url
from tests.training.conftest import upload_dataset
from training.models import TrainingJob

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True, serialized_rollback=True)]

SHARE_OF_A = (
    "def reward(completions, **kwargs):\n"
    "    return [c.count('a') / max(len(c), 1) for c in completions]\n"
)
GRPO_ROWS = [{"prompt": f"Tell me about {w}"} for w in ("cats", "rain", "trains", "music")] * 4
SFT_ROWS = [
    {"text": f"What is {a} plus {b}? The answer is {a + b}."} for a in range(6) for b in range(6)
]
DPO_ROWS = [
    {"prompt": f"What is {a} plus {a}?", "chosen": f" {2 * a}.", "rejected": " I do not know."}
    for a in range(24)
]
TINY = "volume://models/tiny"  # the platform fixture puts the tiny model there
FAST_LORA = {
    "r": 8,
    "alpha": 16,
    "dropout": 0.0,
    "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"],
}


@pytest.fixture
def platform(
    api_client, workspace, live_server, qcluster, settings, tmp_path, local_store_url, tiny_model
):
    """The embedded default, live: API server, qcluster, local provider, local store; the tiny
    model in the volume `models` (TINY)."""
    settings.VERI_STORE = local_store_url
    open_billing_account(workspace=workspace, credit_micros=100_000_000)
    fill_volume(
        workspace,
        "models",
        {f"tiny/{p.name}": p.read_bytes() for p in tiny_model.iterdir() if p.is_file()},
    )
    instances = tmp_path / "instances"

    def start(**env):
        qcluster(VERI_PUBLIC_URL=live_server.url, VERI_LOCAL_INSTANCES_DIR=str(instances), **env)

    start.instances = instances
    return start


def client_for_workspace(api_client) -> str:
    """The raw API key behind the test's client, for the SDK and the CLI."""
    return api_client.raw_key


def submit(api_client, rows, **fields) -> str:
    """Submit a job on `rows`, uploaded as its dataset (or on `dataset_id` when given)."""
    dataset_id = fields.pop("dataset_id", None) or upload_dataset(api_client, rows)["id"]
    body = {"dataset_id": dataset_id, "gpu_type": "cpu", "lora": FAST_LORA} | fields
    response = api_client.post("/v1/training_jobs", body, format="json")
    assert response.status_code == 201, response.json()
    return response.json()["id"]


def training_processes(job_id: str) -> dict[int, int]:
    """The training processes (`worker.train`) on the job's local machine: {rank: pid}."""
    host = int(Instance.objects.get(job__public_id=job_id).external_id.split(":")[0])
    children: dict[int, list[int]] = {}
    for proc in Path("/proc").iterdir():
        with contextlib.suppress(OSError, ValueError, IndexError):
            parent = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
            children.setdefault(parent, []).append(int(proc.name))
    below, found = list(children.get(host, [])), {}
    while below:  # the machine's processes: the worker, its sandboxes, the training in them
        pid = below.pop()
        below += children.get(pid, [])
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"python" in Path(os.fsdecode(argv[0])).name.encode() and b"worker.train" in argv:
            rank = next((int(v[5:]) for v in environ if v.startswith(b"RANK=")), 0)
            found[rank] = pid
    return found


def wait_settled(job_id: str, timeout: float = 240) -> TrainingJob:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = TrainingJob.objects.filter(
            public_id=job_id, billing__billing_deducted_at__isnull=False
        ).first()
        if job:
            return job
        time.sleep(0.5)
    job = TrainingJob.objects.get(public_id=job_id)
    raise AssertionError(f"{job_id} still {job.status} after {timeout}s")


def download_final(api_client, job_id: str, into: Path) -> Path:
    checkpoints = api_client.get(f"/v1/training_jobs/{job_id}/checkpoints").json()["data"]
    [final] = [c for c in checkpoints if c["final"]]
    for file in final["files"]:
        target = into / file["path"]
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(get_url(api_client, file["url"]))
    return into


def assert_loads_and_generates(folder: Path, base: Path | None = None) -> None:
    """transformers + peft load the downloaded checkpoint and generate with it (in the model
    checks' process, so the test process does not import torch). With `base`, as the README says
    to load an adapter whose base model came from a volume: the base from a local copy, then the
    adapter."""
    load = (
        "from peft import PeftModel\n"
        "from transformers import AutoModelForCausalLM\n"
        "base = AutoModelForCausalLM.from_pretrained(sys.argv[2])\n"
        "m = PeftModel.from_pretrained(base, sys.argv[1])\n"
        if base
        else "from peft import AutoPeftModelForCausalLM\n"
        "m = AutoPeftModelForCausalLM.from_pretrained(sys.argv[1])\n"
    )
    script = (
        "import sys\n"
        f"{load}"
        "from transformers import AutoTokenizer\n"
        "t = AutoTokenizer.from_pretrained(sys.argv[1])\n"
        "ids = t('Tell me', return_tensors='pt').input_ids\n"
        "out = m.generate(ids, max_new_tokens=4, do_sample=False)\n"
        "print('generated', out.shape[1] > ids.shape[1])\n"
    )
    result = model_python.run(script, str(folder), *([str(base)] if base else []))
    assert "generated True" in result.stdout, result.stderr[-2000:]


def metric_series(api_client, job_id: str, name: str) -> list[float]:
    points = api_client.get(f"/v1/training_jobs/{job_id}/metrics", {"limit": 200}).json()["data"]
    return [p["values"][name] for p in points if name in p["values"]]


def assert_reward_rises(api_client, job_id: str, steps: int) -> None:
    """The GRPO bar: the mean reward of the last fifth of the steps is over the first fifth's by
    more than 0.1 (on the tiny model, a reward that learns nothing wanders by about 0.02)."""
    rewards = metric_series(api_client, job_id, "reward")
    assert len(rewards) == steps, rewards
    fifth = steps // 5
    first, last = statistics.mean(rewards[:fifth]), statistics.mean(rewards[-fifth:])
    assert last > first + 0.1, rewards


def test_grpo_learns_a_rewarded_character_and_hands_back_a_loadable_adapter(
    api_client, platform, tiny_model, tmp_path, workspace
):
    platform()
    job_id = submit(
        api_client,
        GRPO_ROWS,
        base_model=TINY,
        method="grpo",
        reward_source=SHARE_OF_A,
        hyperparameters={
            "learning_rate": 1e-2,
            "max_steps": 40,
            "batch_size": 16,
            "rollouts_per_prompt": 8,
            "max_response_length": 16,
            "kl_coef": 0.0,
        },
    )
    job = wait_settled(job_id)
    assert job.status == "completed", (job.error_code, job.error_message)
    assert_reward_rises(api_client, job_id, 40)
    got = api_client.get(f"/v1/training_jobs/{job_id}").json()
    assert got["last_step"] == 40 and got["started_at"] and float(got["cost_usd"]) > 0
    full = api_client.get(f"/v1/training_jobs/{job_id}/logs/full").getvalue().decode()
    assert "[veri] training finished at step 40" in full
    # One readable line per step, not the trainer's raw dicts.
    progress = [line for line in full.splitlines() if line.startswith("step ")]
    assert len(progress) == 40 and progress[-1].startswith("step 40/40  loss "), progress[-3:]
    assert " reward " in progress[0] and " s/step" in progress[0] and " eta " in progress[0]
    assert "{'loss'" not in full and "'reward'" not in full
    # Libraries' notices to their callers are not the customer's to read.
    assert "FutureWarning" not in full and "mtime may not be reliable" not in full
    folder = download_final(api_client, job_id, tmp_path / "ckpt")
    assert (folder / "tokenizer.json").exists()
    config = json.loads((folder / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == TINY  # not the worker's mount
    assert_loads_and_generates(folder, base=tiny_model)
    samples = api_client.get(f"/v1/training_jobs/{job_id}/samples", {"limit": 200}).json()["data"]
    assert {s["step"] for s in samples} >= {2, 40}  # every 2 steps of 40, four each
    assert all(set(s["rewards"]) == {"reward"} and "Tell me about" in s["prompt"] for s in samples)


def test_sft_loss_falls_and_dpo_completes(api_client, platform, tiny_model, tmp_path):
    platform(VERI_LOCAL_SLOTS="2")
    sft = submit(
        api_client,
        SFT_ROWS,
        base_model=TINY,
        method="sft_text",
        hyperparameters={
            "learning_rate": 5e-3,
            "max_steps": 20,
            "batch_size": 8,
            "max_seq_length": 64,
        },
    )
    dpo = submit(
        api_client,
        DPO_ROWS,
        base_model=TINY,
        method="dpo",
        hyperparameters={
            "learning_rate": 5e-3,
            "max_steps": 10,
            "batch_size": 8,
            "max_seq_length": 64,
        },
    )
    for job_id in (sft, dpo):
        job = wait_settled(job_id)
        assert job.status == "completed", (job.error_code, job.error_message)
        assert (
            "training finished"
            in api_client.get(f"/v1/training_jobs/{job_id}/logs/full").getvalue().decode()
        )
        folder = download_final(api_client, job_id, tmp_path / job_id)
        assert_loads_and_generates(folder, base=tiny_model)
    losses = metric_series(api_client, sft, "loss")
    assert len(losses) >= 20 and statistics.mean(losses[-5:]) < statistics.mean(losses[:5]) * 0.7
    margins = metric_series(api_client, dpo, "rewards/margins")
    assert len(margins) == 10


def test_checkpoints_keep_two_and_a_killed_job_resumes_at_its_step(
    api_client, platform, tiny_model
):
    platform(VERI_WATCH_PERIOD_SECONDS="1")
    job_id = submit(
        api_client,
        SFT_ROWS * 4,
        base_model=TINY,
        method="sft_text",
        checkpoint_every=5,
        checkpoint_keep=2,
        heartbeat_timeout_seconds=30,
        hyperparameters={
            "learning_rate": 5e-3,
            "max_steps": 200,
            "batch_size": 2,
            "max_seq_length": 64,
        },
    )
    # The API's shortest deadline is 30 s; the watchdog reads the job's own at each tick, so 15 s
    # here is the same rule with half the wait.
    TrainingJob.objects.filter(public_id=job_id).update(heartbeat_timeout_seconds=15)
    # Let it pass step 10, then kill the worker (the instance itself stays up, like an OOM kill).
    deadline = time.monotonic() + 180
    while (TrainingJob.objects.get(public_id=job_id).last_step or 0) < 12:
        assert time.monotonic() < deadline, "the job never reached step 12"
        time.sleep(0.2)
    instance = Instance.objects.get(job__public_id=job_id)
    host_pid = int(instance.external_id.split(":")[0])
    children = subprocess.run(
        ["pgrep", "-P", str(host_pid)], capture_output=True, text=True
    ).stdout.split()
    for pid in children:
        os.kill(int(pid), signal.SIGKILL)
    killed_at = time.monotonic()
    job = wait_settled(job_id, timeout=120)
    assert (job.status, job.error_code) == ("failed", "heartbeat_timeout"), job.error_message
    assert time.monotonic() - killed_at < 15 + 20  # the deadline, plus the watchdog's period
    instance.refresh_from_db()
    assert instance.terminated_at is not None
    checkpoints = api_client.get(f"/v1/training_jobs/{job_id}/checkpoints").json()["data"]
    assert len(checkpoints) == 2 and all(not c["final"] for c in checkpoints)
    newest = max(c["step"] for c in checkpoints)
    assert newest >= 10

    TrainingJob.objects.filter(public_id=job_id).update(heartbeat_timeout_seconds=30)  # as asked
    resumed = api_client.post(f"/v1/training_jobs/{job_id}/resume", {}, format="json").json()
    TrainingJob.objects.filter(public_id=resumed["id"]).update(
        hyperparameters={**job.hyperparameters, "max_steps": newest + 3}
    )
    job = wait_settled(resumed["id"])
    assert job.status == "completed", (job.error_code, job.error_message)
    steps = [
        p["step"]
        for p in api_client.get(f"/v1/training_jobs/{resumed['id']}/metrics").json()["data"]
    ]
    assert min(steps) == newest + 1 and job.last_step == newest + 3
    full = api_client.get(f"/v1/training_jobs/{resumed['id']}/logs/full").getvalue().decode()
    assert f"at step {newest}" in full


def test_worker_faults_are_reported_with_their_codes(api_client, platform, tiny_model, workspace):
    from volumes.models import VolumeFile
    from volumes.stores import get_store

    platform(VERI_LOCAL_SLOTS="3")
    raising = submit(
        api_client,
        GRPO_ROWS,
        base_model=TINY,
        method="grpo",
        reward_source="def reward(completions, **kw):\n    raise ValueError('bad reward')\n",
        hyperparameters={
            "max_steps": 2,
            "batch_size": 8,
            "rollouts_per_prompt": 8,
            "max_response_length": 8,
        },
    )
    # Each file its own object, so that one of them is gone from the store.
    files = {f"part-{i}.jsonl": b"12345" for i in range(3)}
    fill_volume(workspace, "corpus", files, packed=False)
    get_store().delete([VolumeFile.objects.get(path="part-1.jsonl").object_key])
    incomplete = submit(
        api_client,
        SFT_ROWS,
        base_model=TINY,
        method="sft_text",
        volumes=["corpus"],
        hyperparameters={"max_steps": 1},
    )
    for job_id, code in [(raising, "training_error"), (incomplete, "volume_sync_incomplete")]:
        job = wait_settled(job_id)
        assert (job.status, job.error_code) == ("failed", code), job.error_message
    assert "part-1.jsonl" in TrainingJob.objects.get(public_id=incomplete).error_message
    full = api_client.get(f"/v1/training_jobs/{raising}/logs/full").getvalue().decode()
    assert "Traceback" in full and "ValueError: bad reward" in full
    assert full.count("[veri] failed: training_error") == 1


def test_disk_check_and_a_refusing_store(api_client, platform, tiny_model, workspace, settings):
    # Room for the model's volume alone (it stays under 80 % of "free" disk), not with 1 MB more.
    model_bytes = sum(p.stat().st_size for p in tiny_model.iterdir() if p.is_file())
    free = int((model_bytes + 500_000) / 0.8)
    platform(VERI_LOCAL_SLOTS="2", VERI_WORKER_ASSUME_FREE_DISK_BYTES=str(free))
    fill_volume(workspace, "big", {"data.bin": b"x" * 1_000_000})
    too_big = submit(
        api_client,
        SFT_ROWS,
        base_model=TINY,
        method="sft_text",
        volumes=["big"],
        hyperparameters={"max_steps": 1},
    )
    refused = submit(
        api_client,
        SFT_ROWS,
        base_model=TINY,
        method="sft_text",
        hyperparameters={"max_steps": 2},
    )
    # The store cannot write under the job's final/ folder: a file stands where it should be.
    job = TrainingJob.objects.select_related("workspace").get(public_id=refused)
    blocker = (
        Path(settings.VERI_STORE.removeprefix("file://"))
        / "objects"
        / job.output_prefix.value
        / "final"
    )
    blocker.parent.mkdir(parents=True, exist_ok=True)
    blocker.write_text("not a folder")
    job = wait_settled(too_big)
    assert (job.status, job.error_code) == ("failed", "volume_too_large_for_node"), (
        job.error_message
    )
    job = wait_settled(refused)
    assert (job.status, job.error_code) == ("failed", "upload_failed"), job.error_message
    assert "adapter_model.safetensors" in job.error_message and "503" in job.error_message


def test_max_cost_stops_a_real_job_after_a_checkpoint_and_charges_the_cap(
    api_client, platform, settings
):
    # Two cents a second: the cap is reached 15 s after launch, well into training.
    settings.VERI_LOCAL_PRICE_PER_HOUR = "72"
    platform(VERI_LOCAL_PRICE_PER_HOUR="72")
    job_id = submit(
        api_client,
        SFT_ROWS * 4,
        base_model=TINY,
        method="sft_text",
        checkpoint_every=10,
        heartbeat_timeout_seconds=30,
        max_cost_usd="0.30",
        hyperparameters={
            "learning_rate": 5e-3,
            "max_steps": 20_000,
            "batch_size": 2,
            "max_seq_length": 64,
        },
    )
    job = wait_settled(job_id, timeout=240)
    assert (job.status, job.error_code) == ("failed", "budget_exceeded"), job.error_message
    assert "Stopped at step" in job.error_message  # the worker stopped itself, not the watchdog
    assert job.billing.cost_micros == 300_000
    charges = LedgerEntry.objects.filter(job=job).values_list("kind", "amount_micros")
    assert list(charges) == [("job_charge", -300_000)]
    checkpoints = api_client.get(f"/v1/training_jobs/{job_id}/checkpoints").json()["data"]
    assert checkpoints and not any(c["final"] for c in checkpoints)
    newest = max(c["step"] for c in checkpoints)
    assert str(newest) in job.error_message  # the stop saved one at the step it stopped


def test_the_seeds_submit_snippet_runs_as_written(
    api_client, platform, tiny_model, tmp_path, capsys, live_server, monkeypatch
):
    """The managed-training page's snippet, with the tiny model from a volume and a local
    dataset in place of the hub model: submit, wait() streaming the log, download()."""
    platform()
    key = client_for_workspace(api_client)
    monkeypatch.setenv("VERI_API_URL", live_server.url)
    monkeypatch.setenv("VERI_API_KEY", key)
    (tmp_path / "math_reward.py").write_text(SHARE_OF_A)
    rows = tmp_path / "train.jsonl"
    rows.write_text("".join(json.dumps(r) + "\n" for r in GRPO_ROWS))
    monkeypatch.chdir(tmp_path)

    from veri_sdk import Client

    client = Client()
    dataset = client.datasets.upload("train.jsonl")
    job = client.training_jobs.create(
        base_model=TINY,
        dataset_id=dataset.id,
        reward_source=open("math_reward.py").read(),  # noqa: SIM115 - as the seed writes it
        output_name="qwen-0.5b-math",
        method="grpo",
        hyperparameters={
            "learning_rate": 1e-2,
            "rollouts_per_prompt": 4,
            "max_response_length": 16,
            "kl_coef": 0.001,
            "max_steps": 6,
        },
        gpu_type="cpu",
        gpu_count=1,
    )
    capsys.readouterr()
    job = job.wait(poll_interval=15)
    streamed = capsys.readouterr().out
    assert job.status == "completed", job.error
    assert "step 6/6" in streamed and "[veri] training finished at step 6" in streamed
    folder = job.download(output_dir="./checkpoints")
    assert folder.resolve() == tmp_path / "checkpoints" / job.id
    assert_loads_and_generates(folder, base=tiny_model)


def test_veri_train_and_veri_run_take_a_job_from_file_to_trained_model(
    api_client, platform, tiny_model, tmp_path, capsys, live_server, monkeypatch, workspace
):
    """One decorated reward and one command; and the shipped TOML configs, as written. Each
    GRPO example's reward rises within its own steps."""
    platform(VERI_LOCAL_SLOTS="2")
    fill_volume(
        workspace,
        "demo-data",
        {f"models/tiny-qwen2/{p.name}": p.read_bytes() for p in tiny_model.iterdir()},
    )
    monkeypatch.setenv("VERI_API_URL", live_server.url)
    monkeypatch.setenv("VERI_API_KEY", client_for_workspace(api_client))
    monkeypatch.chdir(tmp_path)
    from veri_sdk.cli import main

    capsys.readouterr()
    assert main(["train", str(REPO / "examples" / "train_grpo.py")]) == 0
    out = capsys.readouterr().out
    assert "share_of_a is usable" in out and "completed at step 30" in out
    [trained] = (tmp_path / "checkpoints").iterdir()
    assert (trained / "adapter_config.json").is_file()
    assert_reward_rises(api_client, trained.name, 30)
    # Where its start-up went: every phase, in order, in the API and in `veri jobs get`.
    job_id = trained.name
    timings = api_client.get(f"/v1/training_jobs/{job_id}").json()["timings"]
    phases = [
        "queued",
        "launched",
        "registered",
        "volumes_synced",
        "model_loaded",
        "first_step",
        "first_checkpoint",
    ]
    assert None not in [timings[f"{phase}_at"] for phase in phases], timings
    stamps = [datetime.fromisoformat(timings[f"{phase}_at"]) for phase in phases]
    assert stamps == sorted(stamps), timings
    assert timings["synced_bytes"] > 0 and timings["sync_bytes_per_second"] > 0
    assert main(["jobs", "get", job_id]) == 0
    shown = capsys.readouterr().out
    [line] = [x.strip() for x in shown.splitlines() if x.strip().startswith("start-up")]
    labels = ["queued", "launched +", "worker registered +", "volumes synced +"]
    labels += ["model loaded +", "first step +", "first checkpoint +"]
    places = [line.find(label) for label in labels]
    assert -1 not in places and places == sorted(places), line

    assert main(["run", str(REPO / "configs" / "grpo.toml")]) == 0
    out = capsys.readouterr().out
    assert "completed at step 30" in out
    grpo = TrainingJob.objects.filter(output_name="tiny-grpo").get()
    assert_reward_rises(api_client, grpo.public_id, 30)

    assert main(["run", str(REPO / "configs" / "sft.toml")]) == 0
    out = capsys.readouterr().out
    assert "completed at step 20" in out
    assert len(list((tmp_path / "checkpoints").iterdir())) == 3
