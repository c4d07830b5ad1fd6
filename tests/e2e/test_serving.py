"""Serve what was trained: a fine-tune of the tiny model deployed on the local provider answers
the official `openai` client (streaming and not) exactly as base + adapter do under PEFT, idles
down to zero (its serving process gone), answers a cold request 503 + Retry-After and wakes,
and stays invisible to another workspace; two fine-tunes on one deployment each answer as their
own adapter does; load adds a replica and idle takes both away — against a live server and a
real task cluster."""

import json
import os
import signal
import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import httpx
import openai
import pytest
from django.utils import timezone
from django_q.tasks import async_task

from billing.models import LedgerEntry
from providers.local import LocalProvider
from serving.models import Deployment, Replica
from tests import model_python
from tests.conftest import assert_error
from tests.e2e.test_openai_fine_tuning import FAST, SUPERVISED, wait_for_status
from tests.e2e.test_training import TINY, download_final, platform  # noqa: F401 - a fixture
from tests.openai_api.conftest import jsonl, openai_client

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True, serialized_rollback=True)]

QUESTION = [{"role": "user", "content": "Name a fruit."}]
TOKENS = 12
ROWS = [
    {"messages": QUESTION + [{"role": "assistant", "content": "plum plum plum is a fruit."}]}
] * 32

GREEDY = """
import json, sys
from peft import PeftModel
from transformers import AutoModelForCausalLM, AutoTokenizer
base_path, adapter_paths = sys.argv[1], json.loads(sys.argv[2])
messages, tokens = json.loads(sys.argv[3]), int(sys.argv[4])
tokenizer = AutoTokenizer.from_pretrained(base_path)
ids = tokenizer.apply_chat_template(
    messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
)["input_ids"]
answers = []
for adapter in [None] + adapter_paths:
    model = AutoModelForCausalLM.from_pretrained(base_path)
    if adapter:
        model = PeftModel.from_pretrained(model, adapter)
    out = model.generate(ids, max_new_tokens=tokens, do_sample=False)
    answers.append(tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True))
print(json.dumps(answers))
"""


def peft_greedy(base, *adapters) -> tuple[str, ...]:
    """(base, base + each adapter…) greedy answers to QUESTION, by transformers + PEFT
    themselves."""
    result = model_python.run(
        GREEDY, str(base), json.dumps([str(a) for a in adapters]), json.dumps(QUESTION), str(TOKENS)
    )
    assert result.returncode == 0, result.stderr
    return tuple(json.loads(result.stdout.strip().splitlines()[-1]))


def idle_past_its_timeout(deployment_id: str) -> None:
    """As if its last request were 11 s ago, past the shortest idle timeout (10 s) its test has
    just set, instead of waiting that out."""
    Deployment.objects.filter(public_id=deployment_id).update(
        last_active_at=timezone.now() - timedelta(seconds=11)
    )


def wait_deployment(api_client, deployment_id: str, status: str, timeout: float = 240) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        deployment = api_client.get(f"/v1/deployments/{deployment_id}").json()
        if deployment["status"] == status:
            return deployment
        assert deployment["status"] != "failed", deployment
        time.sleep(0.5)
    events = api_client.get(f"/v1/deployments/{deployment_id}/events").json()["data"]
    raise AssertionError(f"{deployment_id} not {status} after {timeout} s: {deployment} {events}")


def fine_tune_job(client: openai.OpenAI, rows: list[dict] = ROWS):
    """The tiny model fine-tuned on `rows` through the OpenAI-compatible API (its job
    succeeded): the live platform's setup for serving tests (tests/browser/test_playground.py
    too)."""
    training = client.files.create(file=("f.jsonl", jsonl(rows)), purpose="fine-tune")
    job = client.fine_tuning.jobs.create(
        model=TINY,
        training_file=training.id,
        seed=3,
        method=SUPERVISED,
        extra_body={"veri": FAST},
    )
    job = wait_for_status(client, job.id, {"succeeded", "failed", "cancelled"})
    assert job.status == "succeeded", job.error
    return job


@pytest.fixture
def fine_tune(platform, live_server, api_client, tmp_path):  # noqa: F811
    """Fine-tune the tiny model on rows through the official client, on the live platform:
    (its `ft:` model, its final adapter downloaded)."""
    platform()
    client = openai_client(live_server, api_client.raw_key)

    def train(rows: list[dict]) -> tuple[str, Path]:
        job = fine_tune_job(client, rows)
        job_id = job.model_extra["veri_job_id"]
        return job.fine_tuned_model, download_final(api_client, job_id, tmp_path / job_id)

    return train


def deploy(api_client, **body) -> dict:
    created = api_client.post("/v1/deployments", body, format="json")
    assert created.status_code == 201, created.json()
    return wait_deployment(api_client, created.json()["id"], "ready")


def ask(client: openai.OpenAI, model: str, **kwargs):
    return client.chat.completions.create(
        model=model, messages=QUESTION, **({"temperature": 0, "max_tokens": TOKENS} | kwargs)
    )


@dataclass(frozen=True)
class Deployed:
    client: openai.OpenAI  # the official client, with the test workspace's key
    model: str  # the fine-tune's `ft:` name; its base (TINY) is served by the same deployment
    job_id: str  # the Veri training job behind it
    deployment: dict  # as POST /v1/deployments answered


@pytest.fixture
def deployed_fine_tune(platform, live_server, api_client) -> Deployed:  # noqa: F811
    """The embedded default, live, with a fine-tune of the tiny model trained through the
    official `openai` client and deployed on the local provider, ready to answer."""
    platform()
    client = openai_client(live_server, api_client.raw_key)
    job = fine_tune_job(client)

    created = api_client.post(
        "/v1/deployments",
        {"adapters": [job.fine_tuned_model], "idle_timeout_seconds": 600},
        format="json",
    )
    assert created.status_code == 201, created.json()
    deployment = created.json()
    assert deployment["base_model"] == TINY and deployment["status"] == "starting"
    wait_deployment(api_client, deployment["id"], "ready")
    return Deployed(client, job.fine_tuned_model, job.model_extra["veri_job_id"], deployment)


def test_a_deployed_fine_tune_answers_the_openai_client_scales_to_zero_and_wakes(
    deployed_fine_tune,
    live_server,
    api_client,
    other_api_client,
    tiny_model,
    tmp_path,
    settings,
):
    client, model = deployed_fine_tune.client, deployed_fine_tune.model
    deployment = deployed_fine_tune.deployment
    base_text, adapter_text = peft_greedy(
        tiny_model, download_final(api_client, deployed_fine_tune.job_id, tmp_path / "ft")
    )
    assert base_text != adapter_text  # the adapter changes the greedy answer
    answer = ask(client, model)
    assert answer.choices[0].message.content == adapter_text
    assert answer.model == model and answer.usage.completion_tokens > 0
    chunks = [
        c.choices[0].delta.content or "" for c in ask(client, model, stream=True) if c.choices
    ]
    assert len([c for c in chunks if c]) > 1 and "".join(chunks) == adapter_text
    assert ask(client, TINY).choices[0].message.content == base_text  # the base, same replica

    # Another workspace sees no deployment and cannot call the model.
    other = openai_client(live_server, other_api_client.raw_key)
    with pytest.raises(openai.NotFoundError):
        ask(other, model)
    assert other_api_client.get(f"/v1/deployments/{deployment['id']}").status_code == 404
    assert deployment["id"] not in str(other_api_client.get("/v1/deployments").json())

    # Idle past its (now short) timeout, the schedule's task scales it to zero: the serving
    # process is gone.
    path = f"/v1/deployments/{deployment['id']}"
    short = api_client.patch(path, {"idle_timeout_seconds": 10}, format="json").json()
    assert short["idle_timeout_seconds"] == 10 and short["status"] == "ready"
    [replica] = Replica.objects.filter(deployment__public_id=deployment["id"])
    idle_past_its_timeout(deployment["id"])
    async_task("serving.tasks.watch_deployments")
    wait_deployment(api_client, deployment["id"], "stopped", timeout=60)
    assert not LocalProvider().states([replica.external_id])[replica.external_id].alive
    events = [
        e["type"]
        for e in api_client.get(f"/v1/deployments/{deployment['id']}/events").json()["data"]
    ]
    assert events[-3:] == ["scaling_down", "replica_stopped", "stopped"]
    [charge] = LedgerEntry.objects.filter(kind="deployment_charge")  # its uptime, once
    assert charge.amount_micros < 0 and replica.public_id in charge.description

    # Cold: 503 + Retry-After in OpenAI's shape, and the request wakes it; the client's own
    # retries then get the answer.
    api_client.patch(path, {"idle_timeout_seconds": 600}, format="json")
    settings.VERI_SERVING_WAIT_SECONDS = 0
    cold = httpx.post(
        f"{live_server.url}/v1/chat/completions",
        headers={"Authorization": f"Bearer {api_client.raw_key}"},
        json={"model": model, "messages": QUESTION, "max_tokens": TOKENS},
        timeout=30,
    )
    assert cold.status_code == 503 and int(cold.headers["Retry-After"]) > 0
    assert cold.json()["error"]["code"] == "model_starting"
    assert cold.json()["error"]["type"] == "server_error"
    patient = client.with_options(max_retries=30)
    assert ask(patient, model).choices[0].message.content == adapter_text

    # Its serving process killed: the schedule's task finds it gone and fails the replica with
    # the catalog's code, the platform's (its uptime is charged up to the loss, then that
    # stretch credited back); the deployment stops until the next request.
    [_, woken] = Replica.objects.filter(deployment__public_id=deployment["id"]).order_by("pk")
    os.killpg(int(woken.external_id.split(":")[0]), signal.SIGKILL)
    async_task("serving.tasks.watch_deployments")
    wait_deployment(api_client, deployment["id"], "stopped", timeout=60)
    failed = api_client.get(f"{path}/events").json()["data"][-2]
    assert failed["type"] == "replica_failed" and failed["detail"]["code"] == "replica_failed"
    [_, lost] = LedgerEntry.objects.filter(kind="deployment_charge").order_by("pk")
    [credit] = LedgerEntry.objects.filter(kind="refund_credit")
    assert woken.public_id in lost.description and credit.amount_micros == -lost.amount_micros

    assert api_client.delete(path).status_code == 204
    assert_error(api_client.get(path), 404, "not_found")


def test_two_adapters_on_one_deployment_answer_differently_each_as_its_own_peft(
    fine_tune, live_server, api_client, tiny_model
):
    kiwi_rows = [
        {"messages": QUESTION + [{"role": "assistant", "content": "kiwi, kiwi and kiwi again."}]}
    ] * 32
    plum, plum_adapter = fine_tune(ROWS)
    kiwi, kiwi_adapter = fine_tune(kiwi_rows)
    deployment = deploy(api_client, adapters=[plum, kiwi])
    assert [a["name"] for a in deployment["adapters"]] == [plum, kiwi]
    assert len(deployment["replicas"]) == 1  # one serving process holds both

    _, plum_text, kiwi_text = peft_greedy(tiny_model, plum_adapter, kiwi_adapter)
    assert plum_text != kiwi_text  # trained differently, they answer differently
    client = openai_client(live_server, api_client.raw_key)
    assert ask(client, plum).choices[0].message.content == plum_text
    assert ask(client, kiwi).choices[0].message.content == kiwi_text
    listed = {m.id for m in client.models.list()}
    assert {plum, kiwi} <= listed


def test_load_adds_a_replica_requests_spread_and_idle_takes_both_away(
    platform,  # noqa: F811
    live_server,
    api_client,
    settings,
):
    # A low target and window: four clients streaming at once load one CPU replica past them.
    load = {"VERI_SERVING_TARGET_INFLIGHT": 1, "VERI_SERVING_SCALE_WINDOW_SECONDS": 1}
    platform(**{k: str(v) for k, v in load.items()})
    for name, value in load.items():
        setattr(settings, name, value)
    deployment = deploy(api_client, base_model=TINY, max_replicas=2, idle_timeout_seconds=600)
    path = f"/v1/deployments/{deployment['id']}"
    client = openai_client(live_server, api_client.raw_key).with_options(max_retries=5)
    stop, answers, failures = threading.Event(), [], []

    def stream() -> None:
        while not stop.is_set():
            try:
                chunks = ask(client, TINY, stream=True, max_tokens=48)
                answers.append("".join(c.choices[0].delta.content or "" for c in chunks))
            except openai.APIError as exc:  # noqa: PERF203 - each failure is kept
                failures.append(exc)

    clients = [threading.Thread(target=stream) for _ in range(4)]
    for thread in clients:
        thread.start()
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            replicas = api_client.get(path).json()["replicas"]
            served = [r for r in replicas if r["status"] == "ready" and r["requests"] >= 3]
            if len(served) == 2:
                break
            time.sleep(1)
        else:
            raise AssertionError(f"no second replica serving: {api_client.get(path).json()}")
    finally:
        stop.set()
        for thread in clients:
            thread.join(timeout=120)
    assert not failures and answers
    events = api_client.get(f"{path}/events").json()["data"]
    [up] = [e for e in events if e["type"] == "scaling_up"]
    assert up["detail"]["inflight"] > up["detail"]["ready_replicas"] == 1
    assert api_client.get(path).json()["status"] == "ready"

    # Idle past its timeout, both replicas go (min_replicas 0), their machines terminated.
    api_client.patch(path, {"idle_timeout_seconds": 10}, format="json")
    idle_past_its_timeout(deployment["id"])
    async_task("serving.tasks.watch_deployments")
    wait_deployment(api_client, deployment["id"], "stopped", timeout=60)
    both = Replica.objects.filter(deployment__public_id=deployment["id"])
    assert sorted(r.status for r in both) == ["stopped", "stopped"]
    alive = LocalProvider().states([r.external_id for r in both])
    assert not any(state.alive for state in alive.values())
