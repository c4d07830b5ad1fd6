"""An unmodified `openai` client trains on Veri: files, supervised, DPO and reinforcement jobs
(graders as rewards), events, checkpoints, result files, the fine-tuned model's adapter, pause
and resume, and the `fine_tuning.job.succeeded` webhook — against a live server, a real task
cluster, the local provider and real TRL on the tiny model."""

import csv
import io
import statistics
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import openai
import pytest

from tests.conftest import REPO, fill_volume, run_python, serve_in_background
from tests.e2e.test_training import (  # noqa: F401 - platform is a fixture
    FAST_LORA,
    TINY,
    assert_loads_and_generates,
    download_final,
    platform,
)
from tests.openai_api.conftest import PREFERENCE_ROWS, jsonl, openai_client
from tests.wandb_files import history, offline_run

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True, serialized_rollback=True)]

DONE = {"succeeded", "failed", "cancelled"}


def two_turns(first_weight: int) -> list[dict]:
    """Chat rows with two assistant turns; the first one's weight is `first_weight`."""
    return [
        {
            "messages": [
                {"role": "user", "content": f"Name a fruit like {word}."},
                {"role": "assistant", "content": f"{word} is a fruit.", "weight": first_weight},
                {"role": "user", "content": "Another?"},
                {"role": "assistant", "content": f"{word[::-1]} is one too."},
            ]
        }
        for word in ("apple", "pear", "plum", "fig", "lime", "kiwi", "date", "melon") * 4
    ]


def log_of(api_client, veri_job_id: str) -> str:
    """The Veri job's status and the tail of its log, for a failed wait's message."""
    job = api_client.get(f"/v1/training_jobs/{veri_job_id}").json()
    lines = api_client.get(f"/v1/training_jobs/{veri_job_id}/logs").json()["lines"]
    return f"{job['status']} {job['error']}\n" + "\n".join(line["text"] for line in lines[-40:])


def wait_for_status(client, job_id: str, wanted: set[str], timeout: float = 300):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = client.fine_tuning.jobs.retrieve(job_id)
        if job.status in wanted:
            return job
        time.sleep(0.5)
    raise AssertionError(f"{job_id} still {job.status} after {timeout} s")


def newest_steps(client, job_id: str) -> list[int]:
    """The steps of the metrics events on the first (newest) page: a poll of a long run."""
    events = client.fine_tuning.jobs.list_events(job_id, limit=50).data
    return [e.data["step"] for e in events if e.type == "metrics"]


def metrics_events(client, job_id: str) -> list[dict]:
    events = client.fine_tuning.jobs.list_events(job_id, limit=3)  # many pages: auto-paginated
    return sorted((e.data for e in events if e.type == "metrics"), key=lambda data: data["step"])


class Receiver(BaseHTTPRequestHandler):
    got: list[tuple[dict, bytes]] = []

    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        Receiver.got.append((dict(self.headers), body))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def receiver():
    Receiver.got = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    serve_in_background(server)
    yield f"http://127.0.0.1:{server.server_port}/hook"
    server.shutdown()


SUPERVISED = {
    "type": "supervised",
    "supervised": {
        "hyperparameters": {"n_epochs": 2, "batch_size": 8, "learning_rate_multiplier": 25}
    },
}
FAST = {"lora": FAST_LORA, "hyperparameters": {"max_seq_length": 64}}


def test_supervised_job_from_file_to_a_loadable_model_with_its_webhook(
    platform,  # noqa: F811
    live_server,
    api_client,
    tiny_model,
    tmp_path,
    receiver,
    settings,
):
    settings.VERI_WANDB_MODE = "offline"
    platform(VERI_LOCAL_SLOTS="2")
    endpoint = api_client.post(
        "/v1/webhook_endpoints",
        {"url": receiver, "event_types": ["fine_tuning.job.succeeded"]},
        format="json",
    ).json()
    client = openai_client(live_server, api_client.raw_key)
    weighted = client.files.create(file=("a.jsonl", jsonl(two_turns(1))), purpose="fine-tune")
    masked = client.files.create(file=("b.jsonl", jsonl(two_turns(0))), purpose="fine-tune")
    held_out = client.files.create(file=("v.jsonl", jsonl(two_turns(1)[:6])), purpose="fine-tune")
    jobs = [
        client.fine_tuning.jobs.create(
            model=TINY,
            training_file=file.id,
            validation_file=held_out.id,
            suffix="fruit",
            seed=3,
            method=SUPERVISED,
            integrations=[{"type": "wandb", "wandb": {"project": "fruit", "tags": ["sft"]}}],
            extra_body={"veri": FAST},
        )
        for file in (weighted, masked)
    ]
    done = [wait_for_status(client, job.id, DONE) for job in jobs]
    assert [job.status for job in done] == ["succeeded", "succeeded"], [j.error for j in done]
    job = done[0]
    assert job.fine_tuned_model.startswith("ft:volume/models/tiny:acme:fruit:")
    assert job.finished_at
    deadline = time.monotonic() + 60  # the cost is attributed as the job is settled
    while not client.fine_tuning.jobs.retrieve(job.id).model_extra["veri_cost_usd"]:
        assert time.monotonic() < deadline, "no cost on the job"
        time.sleep(0.5)

    # Every event, through the client's auto-pagination: status changes and each step's metrics.
    messages = [e.message for e in client.fine_tuning.jobs.list_events(job.id, limit=3)]
    assert messages[0] == "The job has successfully completed"
    assert messages[-1] == "Fine-tuning job queued" and "Fine-tuning job started" in messages
    metrics = metrics_events(client, job.id)
    assert [m["step"] for m in metrics] == list(range(1, 9))  # 32 rows, batch 8, 2 epochs
    # W&B (offline here) holds the job's loss series.
    work = platform.instances / job.model_extra["veri_job_id"] / "work"
    logged = [row["loss"] for row in history(offline_run(work)) if "loss" in row]
    assert logged == pytest.approx([m["train_loss"] for m in metrics])
    # The mask: the same rows and seed, one assistant turn weighted 0, train on other tokens.
    masked_metrics = metrics_events(client, done[1].id)
    assert masked_metrics[0]["train_loss"] != pytest.approx(metrics[0]["train_loss"], rel=1e-3)

    checkpoints = list(client.fine_tuning.jobs.checkpoints.list(job.id))
    assert [c.step_number for c in checkpoints] == [8, 4]  # one per epoch, newest first
    assert checkpoints[0].fine_tuned_model_checkpoint == f"{job.fine_tuned_model}:ckpt-step-8"
    assert checkpoints[1].metrics.train_loss == pytest.approx(metrics[3]["train_loss"])
    # The validation file is evaluated at each checkpoint (every epoch).
    assert [m["step"] for m in metrics if "valid_loss" in m] == [4, 8]
    assert checkpoints[0].metrics.valid_loss == pytest.approx(metrics[7]["valid_loss"])

    [result] = job.result_files
    table = list(csv.DictReader(io.StringIO(client.files.content(result).text)))
    assert [int(row["step"]) for row in table] == list(range(1, 9))
    assert float(table[0]["train_loss"]) == pytest.approx(metrics[0]["train_loss"])

    # The fine-tuned model trains on: from its adapter, so its first loss is already low.
    again = client.fine_tuning.jobs.create(
        model=job.fine_tuned_model,
        training_file=weighted.id,
        seed=3,
        method=SUPERVISED,
        extra_body={"veri": FAST},
    )
    again = wait_for_status(client, again.id, DONE)
    assert again.status == "succeeded", again.error
    assert again.fine_tuned_model.startswith("ft:volume/models/tiny:acme::")
    first_again = metrics_events(client, again.id)[0]["train_loss"]
    halfway = (metrics[0]["train_loss"] + metrics[-1]["train_loss"]) / 2
    assert first_again < halfway, (first_again, metrics)

    assert job.fine_tuned_model in [m.id for m in client.models.list()]
    assert client.models.retrieve(job.fine_tuned_model).owned_by == "acme"
    folder = download_final(api_client, job.model_extra["veri_job_id"], tmp_path / "adapter")
    assert_loads_and_generates(folder, base=tiny_model)
    assert client.models.delete(done[1].fine_tuned_model).deleted
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve(done[1].fine_tuned_model)

    # The webhook, as OpenAI sends it: the client's own unwrap verifies the signature.
    deadline = time.monotonic() + 60
    while len(Receiver.got) < 3 and time.monotonic() < deadline:
        time.sleep(0.2)
    received = {}
    for headers, body in Receiver.got:
        event = client.webhooks.unwrap(body, headers, secret=endpoint["signing_secret"])
        received[event.data.id] = event.type
    assert received == {j.id: "fine_tuning.job.succeeded" for j in [*jobs, again]}
    headers, body = Receiver.got[0]
    with pytest.raises(openai.InvalidWebhookSignatureError):
        client.webhooks.unwrap(body, headers, secret="whsec_" + "A" * 32)


SHARE_OF_A = (
    "def grade(sample, item):\n"
    "    text = sample['output_text']\n"
    "    return text.count('a') / max(len(text), 1)\n"
)
PROMPTS = [
    {"messages": [{"role": "user", "content": f"Tell me about {w}"}], "letter": "a"}
    for w in ("cats", "rain", "trains", "music")
] * 4
RL = {
    "lora": FAST_LORA,
    "hyperparameters": {"max_steps": 40, "max_response_length": 16, "kl_coef": 0.0},
}
RL_HYPERPARAMETERS = {"batch_size": 2, "learning_rate_multiplier": 2000}


def test_dpo_and_reinforcement_with_graders_learn(
    platform,  # noqa: F811
    live_server,
    api_client,
):
    platform(VERI_LOCAL_SLOTS="2")
    client = openai_client(live_server, api_client.raw_key)
    prompts = client.files.create(file=("rl.jsonl", jsonl(PROMPTS)), purpose="fine-tune")
    prefs = client.files.create(file=("p.jsonl", jsonl(PREFERENCE_ROWS * 3)), purpose="fine-tune")
    graders = {
        "python": {"type": "python", "name": "share_of_a", "source": SHARE_OF_A},
        "string_check": {
            "type": "string_check",
            "name": "has_a",
            "input": "{{sample.output_text}}",
            "reference": "{{item.letter}}",
            "operation": "like",
        },
    }
    rl = {
        name: client.fine_tuning.jobs.create(
            model=TINY,
            training_file=prompts.id,
            seed=42,
            method={
                "type": "reinforcement",
                "reinforcement": {"grader": grader, "hyperparameters": RL_HYPERPARAMETERS},
            },
            extra_body={"veri": RL},
        )
        for name, grader in graders.items()
    }
    dpo = client.fine_tuning.jobs.create(
        model=TINY,
        training_file=prefs.id,
        method={"type": "dpo", "dpo": {"hyperparameters": {"beta": 0.2, "batch_size": 8}}},
        extra_body={"veri": FAST},
    )
    for name, job in rl.items():
        done = wait_for_status(client, job.id, DONE, timeout=600)
        assert done.status == "succeeded", (name, done.error)
        rewards = [m["reward"] for m in metrics_events(client, job.id)]
        assert len(rewards) == 40
        assert statistics.mean(rewards[-8:]) > statistics.mean(rewards[:8]) + 0.1, (name, rewards)
        # graders.run scores a sample as training scored it.
        veri_id = done.model_extra["veri_job_id"]
        sample = api_client.get(f"/v1/training_jobs/{veri_id}/samples").json()["data"][0]
        run = client.fine_tuning.alpha.graders.run(
            grader=graders[name], model_sample=sample["completion"], item={"letter": "a"}
        )
        assert run.reward == pytest.approx(sample["reward"]), (name, sample)
    done = wait_for_status(client, dpo.id, DONE)
    assert done.status == "succeeded", done.error
    assert done.hyperparameters.model_extra.get("beta", None) == 0.2 or done.hyperparameters.beta
    assert any("rewards/margins" in m for m in metrics_events(client, dpo.id))


LONG = {"max_seq_length": 64, "max_steps": 20_000}


def test_pause_resume_and_cancel(
    platform,  # noqa: F811
    live_server,
    api_client,
):
    platform()
    client = openai_client(live_server, api_client.raw_key)
    rows = client.files.create(file=("a.jsonl", jsonl(two_turns(1))), purpose="fine-tune")
    job = client.fine_tuning.jobs.create(
        model=TINY,
        training_file=rows.id,
        method={
            "type": "supervised",
            "supervised": {"hyperparameters": {"n_epochs": 1, "batch_size": 1}},
        },
        # Far longer than a pause takes to reach the worker (its next heartbeat).
        extra_body={"veri": FAST | {"hyperparameters": LONG, "checkpoint_every": 500}},
    )
    first_run = job.model_extra["veri_job_id"]
    wait_for_status(client, job.id, {"running"})
    deadline = time.monotonic() + 120
    while not newest_steps(client, job.id):
        assert time.monotonic() < deadline, log_of(api_client, first_run)
        time.sleep(0.5)
    assert client.fine_tuning.jobs.pause(job.id).status == "paused"
    deadline = time.monotonic() + 120
    while True:  # resume waits for the run to save a checkpoint and stop
        try:
            resumed = client.fine_tuning.jobs.resume(job.id)
            break
        except openai.ConflictError:
            assert time.monotonic() < deadline, log_of(api_client, first_run)
            time.sleep(0.5)
    paused_at = max(c.step_number for c in client.fine_tuning.jobs.checkpoints.list(job.id))
    assert resumed.status in {"queued", "running"}
    assert resumed.model_extra["veri_job_id"] != first_run
    running = wait_for_status(client, job.id, {"running"})
    deadline = time.monotonic() + 120
    while not [step for step in newest_steps(client, job.id) if step > paused_at]:
        assert time.monotonic() < deadline, "the resumed run trained no step"
        time.sleep(0.5)
    assert client.fine_tuning.jobs.cancel(running.id).status == "cancelled"
    messages = [e.message for e in client.fine_tuning.jobs.list_events(job.id, limit=50)]
    assert "The job was paused; resume it to continue from its newest checkpoint" in messages
    assert messages[0] == "The job was cancelled"


def test_the_migration_example_runs_as_written(
    platform,  # noqa: F811
    live_server,
    api_client,
    workspace,
    tiny_model,
):
    platform()
    fill_volume(
        workspace,
        "demo-data",
        {f"models/tiny-qwen2/{p.name}": p.read_bytes() for p in tiny_model.iterdir()},
    )
    env = {"VERI_API_URL": live_server.url, "VERI_API_KEY": api_client.raw_key}
    result = run_python(str(REPO / "examples" / "openai_migration.py"), env=env, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "  The job has successfully completed" in result.stdout
    assert "fine-tuned model: ft:volume/demo-data/models/tiny-qwen2:acme:adder:" in result.stdout
