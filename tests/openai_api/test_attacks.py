"""A hostile customer with two workspaces against the OpenAI-compatible face: another workspace's
objects are never found, graders (customer input, customer code) cannot hang, crash or read the
API process, and malformed requests are answered in OpenAI's error shape."""

import os
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest
from django.utils import timezone

from billing.services import open_billing_account
from openai_api.models import FineTuningJob
from openai_api.services import jobs as job_services
from tests.conftest import client_for, fill_volume
from tests.openai_api.conftest import CHAT_ROWS, jsonl, openai_client
from training.models import Checkpoint, TrainingJob
from training.services import worker
from veri import services as veri_services
from veri.errors import Conflict

pytestmark = pytest.mark.django_db(transaction=True)
TINY = "volume://models/tiny"
ERROR_KEYS = {"message", "type", "param", "code"}


def http_for(live_server, client) -> httpx.Client:
    return httpx.Client(
        base_url=f"{live_server.url}/v1",
        headers={"Authorization": f"Bearer {client.raw_key}"},
        timeout=60,
    )


def assert_openai_error(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, (response.request.url, response.text[:300])
    error = response.json()["error"]
    assert set(error) == ERROR_KEYS, error
    return error


@pytest.fixture
def victim(live_server, db, tiny_model):
    """Workspace B with a file, a job that succeeded (as the worker would have ended it) with a
    checkpoint, a webhook endpoint with a delivery and a secret."""
    workspace, _ = veri_services.create_workspace(name="other")
    other_api_client = client_for(workspace)
    open_billing_account(workspace=workspace, credit_micros=100_000_000)
    fill_volume(
        workspace,
        "models",
        {f"tiny/{p.name}": p.read_bytes() for p in tiny_model.iterdir() if p.is_file()},
    )
    client = openai_client(live_server, other_api_client.raw_key)
    file = client.files.create(file=("chat.jsonl", jsonl(CHAT_ROWS)), purpose="fine-tune")
    job = client.fine_tuning.jobs.create(model=TINY, training_file=file.id, suffix="b")
    ft = FineTuningJob.objects.get(public_id=job.id)
    TrainingJob.objects.filter(pk=ft.job_id).update(status="completed", finished_at=timezone.now())
    for step, final in ((2, False), (4, True)):
        Checkpoint.objects.create(workspace=workspace, job=ft.job, step=step, final=final)
    http = http_for(live_server, other_api_client)
    model = client.fine_tuning.jobs.retrieve(job.id).fine_tuned_model
    assert model and client.models.retrieve(model).id == model  # B sees its own
    endpoint = http.post("/webhook_endpoints", json={"url": "https://example.com/hook"})
    assert endpoint.status_code in (200, 201), endpoint.text
    endpoint_id = endpoint.json()["id"]
    assert http.post(f"/webhook_endpoints/{endpoint_id}/test").status_code < 300
    assert http.put("/secrets/TOKEN", json={"value": "b-secret"}).status_code in (200, 201)
    return {"file": file.id, "job": job.id, "model": model, "endpoint": endpoint_id, "http": http}


def test_another_workspaces_objects_are_not_found_on_any_route(
    live_server, workspace, api_client, victim, tiny_model
):
    open_billing_account(workspace=workspace, credit_micros=100_000_000)
    fill_volume(
        workspace,
        "models",
        {f"tiny/{p.name}": p.read_bytes() for p in tiny_model.iterdir() if p.is_file()},
    )
    http = http_for(live_server, api_client)
    file, job, model, endpoint = victim["file"], victim["job"], victim["model"], victim["endpoint"]
    for method, path in [
        ("GET", f"/files/{file}"),
        ("GET", f"/files/{file}/content"),
        ("DELETE", f"/files/{file}"),
        ("GET", f"/fine_tuning/jobs/{job}"),
        ("GET", f"/fine_tuning/jobs/{job}/events"),
        ("GET", f"/fine_tuning/jobs/{job}/checkpoints"),
        ("POST", f"/fine_tuning/jobs/{job}/cancel"),
        ("POST", f"/fine_tuning/jobs/{job}/pause"),
        ("POST", f"/fine_tuning/jobs/{job}/resume"),
        ("GET", f"/models/{model}"),
        ("GET", f"/models/{model}:ckpt-step-2"),
        ("DELETE", f"/models/{model}"),
        ("DELETE", f"/models/{model}:ckpt-step-2"),
        ("GET", f"/webhook_endpoints/{endpoint}"),
        ("DELETE", f"/webhook_endpoints/{endpoint}"),
        ("POST", f"/webhook_endpoints/{endpoint}/rotate_secret"),
        ("POST", f"/webhook_endpoints/{endpoint}/test"),
        ("GET", f"/webhook_endpoints/{endpoint}/deliveries"),
        ("DELETE", "/secrets/TOKEN"),
    ]:
        response = http.request(method, path)
        assert response.status_code == 404, (method, path, response.text[:300])
    for path in ("/files", "/fine_tuning/jobs"):
        for after in (file, job):
            response = http.get(path, params={"after": after})
            unknown = http.get(path, params={"after": after[:-4] + "zzzz"})
            assert response.status_code == unknown.status_code == 400, path
            assert response.text == unknown.text.replace(after[:-4] + "zzzz", after), path
    listed = http.get("/models").json()["data"]
    assert model not in {m["id"] for m in listed}
    assert http.get("/webhook_endpoints").json()["data"] == []
    assert http.get("/secrets").json()["data"] == []

    client = openai_client(live_server, api_client.raw_key)
    own = client.files.create(file=("chat.jsonl", jsonl(CHAT_ROWS)), purpose="fine-tune")
    for body, param in [
        ({"model": TINY, "training_file": file}, "training_file"),
        ({"model": TINY, "training_file": own.id, "validation_file": file}, "validation_file"),
        ({"model": model, "training_file": own.id}, "model"),
        ({"model": f"{model}:ckpt-step-2", "training_file": own.id}, "model"),
    ]:
        with pytest.raises(openai.BadRequestError) as caught:
            client.fine_tuning.jobs.create(**body)
        assert caught.value.param == param, body
    # B's objects are untouched by all of it.
    b = victim["http"]
    assert b.get(f"/fine_tuning/jobs/{job}").json()["status"] == "succeeded"
    assert b.get(f"/models/{model}").status_code == 200
    assert b.get(f"/files/{file}/content").status_code == 200
    assert [s["name"] for s in b.get("/secrets").json()["data"]] == ["TOKEN"]


def _run(http: httpx.Client, grader: dict, *, sample: str = "x", item: dict | None = None):
    return http.post(
        "/fine_tuning/alpha/graders/run",
        json={"grader": grader, "model_sample": sample, "item": item or {}},
    )


def test_huge_grader_inputs_are_answered_within_the_graders_timeout(
    live_server, api_client, settings
):
    """Text metrics are quadratic and templates multiply the item: a request's worth of either
    must not hold (or exhaust) the API process."""
    settings.VERI_GRADER_TIMEOUT_SECONDS = 3  # the default 10 s, waited out twice, is all alike
    http = http_for(live_server, api_client)
    words = " ".join(f"w{i}" for i in range(150_000))
    rouge = {
        "type": "text_similarity",
        "name": "r",
        "input": "{{sample.output_text}}",
        "reference": "{{item.ref}}",
        "evaluation_metric": "rouge_l",
    }
    amplified = {
        "type": "string_check",
        "name": "s",
        "input": "{{item.a}}" * 300_000,
        "reference": "x",
        "operation": "eq",
    }
    for grader, sample, item in [
        (rouge, words, {"ref": words}),
        (amplified, "x", {"a": "y" * 1_000_000}),
    ]:
        started = time.monotonic()
        response = _run(http, grader, sample=sample, item=item)
        assert time.monotonic() - started < 40
        assert response.status_code == 200, response.text[:300]
        answer = response.json()
        assert answer["reward"] == 0.0
        assert any(v is True for v in answer["metadata"]["errors"].values()), answer


def test_a_formula_nested_past_pythons_recursion_limit_is_an_error_not_a_500(
    live_server, api_client
):
    http = http_for(live_server, api_client)
    one = {"type": "string_check", "name": "a", "input": "x", "reference": "x", "operation": "eq"}
    for formula in ("-" * 1000 + "a", "9**9**9", "a" + "^a" * 300, "log(0)", "sqrt(-1)"):
        grader = {"type": "multi", "name": "m", "graders": {"a": one}, "calculate_output": formula}
        response = _run(http, grader)
        assert response.status_code in (200, 400), (formula, response.text[:300])
        if response.status_code == 200:
            answer = response.json()
            assert answer["reward"] == 0.0 or formula == "a" + "^a" * 300, formula


LEAKY = """
import glob, os, socket

def grade(sample, item):
    leaks = [k for k in os.environ if k == "VERI_CANARY"]
    for path in glob.glob("/proc/*/environ"):
        try:
            if b"canary-value" in open(path, "rb").read():
                leaks.append(path)
        except OSError:
            pass
    for path in item["paths"]:
        try:
            open(path, "rb").read(1)
            leaks.append(path)
        except OSError:
            pass
    try:
        socket.create_connection((item["host"], item["port"]), timeout=2).close()
        leaks.append("network")
    except OSError:
        pass
    if leaks:
        raise RuntimeError("LEAKED " + " ".join(leaks))
    return 1.0
"""


def test_a_python_grader_reads_nothing_of_the_api_process(live_server, api_client, settings):
    os.environ["VERI_CANARY"] = "canary-value"
    try:
        repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        database = settings.DATABASES["default"]
        paths = [
            os.path.join(repo, "config", "settings.py"),
            os.path.join(repo, ".env"),
            os.path.join(repo, "manage.py"),
            str(database.get("NAME") or ""),
            f"/proc/{os.getpid()}/environ",
        ]
        host, port = live_server.thread.host, live_server.thread.port
        response = _run(
            http_for(live_server, api_client),
            {"type": "python", "name": "leak", "source": LEAKY},
            item={"paths": paths, "host": host, "port": port},
        )
    finally:
        del os.environ["VERI_CANARY"]
    assert response.status_code == 200, response.text[:300]
    answer = response.json()
    assert answer["reward"] == 1.0, answer["metadata"]["errors"]


@pytest.mark.parametrize(
    "source",
    [
        "import time\ndef grade(sample, item):\n    time.sleep(3600)\n",
        "def grade(sample, item):\n    x = bytearray(8 * 1024**3)\n    return 1.0\n",
        "import os\ndef grade(sample, item):\n    os.kill(os.getppid(), 9)\n    return 1.0\n",
        "import os\nos._exit(0)\ndef grade(sample, item):\n    return 1.0\n",
        "import sys\ndef grade(sample, item):\n    sys.stdout.write('{\"result\": 1}' * 10**6)\n",
    ],
)
def test_a_hostile_python_grader_ends_as_its_own_error(live_server, api_client, settings, source):
    settings.VERI_GRADER_TIMEOUT_SECONDS = 3  # the sleeping one waits it out
    http = http_for(live_server, api_client)
    started = time.monotonic()
    response = _run(http, {"type": "python", "name": "bad", "source": source})
    assert time.monotonic() - started < 9  # within the setting, not the default 10 s
    assert response.status_code == 200, response.text[:300]
    answer = response.json()
    assert answer["reward"] == 0.0 and answer["metadata"]["errors"]["python_grader_runtime_error"]
    assert http.get("/models").status_code == 200  # the server is still there


def test_malformed_requests_are_4xx_in_openai_shape(live_server, api_client):
    http = http_for(live_server, api_client)
    wrong = []
    bad_utf8 = b'{"grader": "\xff\xfe"}'
    for method, path, kwargs in [
        ("POST", "/fine_tuning/alpha/graders/run", {"content": bad_utf8}),
        ("POST", "/fine_tuning/alpha/graders/validate", {"content": bad_utf8}),
        ("POST", "/fine_tuning/jobs", {"content": b"{" + b" " * (5 * 1024**2) + b"}"}),
        ("POST", "/fine_tuning/alpha/graders/run", {"content": b"[" * 100_000}),
        ("POST", "/files", {"content": b"not multipart"}),
        (
            "POST",
            "/files",
            {"files": {"file": ("a.jsonl", b"\xff\xfe\n")}, "data": {"purpose": "fine-tune"}},
        ),
        ("POST", "/files", {"files": {"file": ("a.bin", b"x")}, "data": {"purpose": ["a", "b"]}}),
        ("GET", "/files?limit=nope", {}),
        ("GET", "/files?after=" + "x" * 10_000, {}),
        ("GET", "/fine_tuning/jobs?limit=1e9", {}),
        ("GET", "/fine_tuning/jobs/nope/events?limit=-1", {}),
        ("GET", "/models/" + "ft:" + "a:" * 100, {}),
        ("GET", "/models/ft:x:y::abcdefghijklmnopqrstuvwx:ckpt-step-99999999999", {}),
        ("POST", "/fine_tuning/jobs/nope/pause", {}),
        ("GET", "/fine_tuning/jobs/nope/nothing", {}),
        ("GET", "/files?after=%00", {}),
    ]:
        headers = (
            {} if "files" in kwargs or "data" in kwargs else {"Content-Type": "application/json"}
        )
        response = http.request(method, path, headers=headers, **kwargs)
        try:
            shaped = set(response.json()["error"]) == ERROR_KEYS
        except (ValueError, KeyError, TypeError):
            shaped = False
        if not (400 <= response.status_code < 500 and shaped):
            wrong.append((method, path[:80], response.status_code, response.text[:200]))
    assert wrong == [], "\n".join(map(str, wrong))


def test_metadata_keys_are_matched_as_keys_not_lookups(
    live_server, workspace, api_client, tiny_model
):
    open_billing_account(workspace=workspace, credit_micros=100_000_000)
    fill_volume(
        workspace,
        "models",
        {f"tiny/{p.name}": p.read_bytes() for p in tiny_model.iterdir() if p.is_file()},
    )
    client = openai_client(live_server, api_client.raw_key)
    file = client.files.create(file=("chat.jsonl", jsonl(CHAT_ROWS)), purpose="fine-tune")
    job = client.fine_tuning.jobs.create(
        model=TINY, training_file=file.id, metadata={"a__range": "1", "team": "red"}
    )
    http = http_for(live_server, api_client)
    for query, found in [
        ("metadata[a__range]=1", [job.id]),
        ("metadata[a__range]=1&metadata[team]=red", [job.id]),
        ("metadata[a__regex]=(", []),
        ("metadata[team__startswith]=r", []),
        ("metadata[team]=re", []),
    ]:
        response = http.get(f"/fine_tuning/jobs?{query}")
        assert response.status_code == 200, (query, response.text[:300])
        assert [j["id"] for j in response.json()["data"]] == found, query


@pytest.fixture
def running(live_server, workspace, api_client, tiny_model):
    """A fine-tuning job whose Veri job is training (as a worker would have started it)."""
    open_billing_account(workspace=workspace, credit_micros=100_000_000)
    fill_volume(
        workspace,
        "models",
        {f"tiny/{p.name}": p.read_bytes() for p in tiny_model.iterdir() if p.is_file()},
    )
    client = openai_client(live_server, api_client.raw_key)
    file = client.files.create(file=("chat.jsonl", jsonl(CHAT_ROWS)), purpose="fine-tune")
    job = client.fine_tuning.jobs.create(model=TINY, training_file=file.id)
    ft = FineTuningJob.objects.get(public_id=job.id)
    TrainingJob.objects.filter(pk=ft.job_id).update(status="running", started_at=timezone.now())
    return client, job.id, ft.job


def test_a_run_that_completes_while_its_pause_is_saving_succeeds(running):
    client, job_id, job = running
    assert client.fine_tuning.jobs.pause(job_id).status == "paused"
    worker.complete(job=job, ok=True, error_code=None, message="")  # it reached its last step
    done = client.fine_tuning.jobs.retrieve(job_id)
    assert done.status == "succeeded" and done.fine_tuned_model and done.finished_at
    assert client.models.retrieve(done.fine_tuned_model).id == done.fine_tuned_model


def test_a_run_that_fails_while_its_pause_is_saving_fails(running):
    client, job_id, job = running
    client.fine_tuning.jobs.pause(job_id)
    worker.complete(job=job, ok=False, error_code="training_error", message="boom")
    assert client.fine_tuning.jobs.retrieve(job_id).status == "failed"
    with pytest.raises(openai.ConflictError):
        client.fine_tuning.jobs.resume(job_id)


def test_a_cancel_while_the_pause_is_saving_cancels_for_good(running):
    client, job_id, job = running
    client.fine_tuning.jobs.pause(job_id)
    assert client.fine_tuning.jobs.cancel(job_id).status == "cancelled"
    with pytest.raises(openai.ConflictError):
        client.fine_tuning.jobs.resume(job_id)
    assert TrainingJob.objects.get(pk=job.pk).cost_waived is False  # it ran: it is charged


def test_concurrent_resumes_start_one_run(live_server, api_client, running):
    client, job_id, job = running
    TrainingJob.objects.filter(pk=job.pk).update(status="queued")  # pausing it cancels at once
    assert client.fine_tuning.jobs.pause(job_id).status == "paused"
    http = http_for(live_server, api_client)
    with ThreadPoolExecutor(8) as pool:
        answers = list(
            pool.map(lambda _: http.post(f"/fine_tuning/jobs/{job_id}/resume"), range(8))
        )
    assert sorted(r.status_code for r in answers) == [200] + [409] * 7
    ft = FineTuningJob.objects.get(public_id=job_id)
    assert ft.earlier_jobs.count() == 1
    assert TrainingJob.objects.filter(workspace=ft.workspace).count() == 2


def test_webhook_and_secret_routes_refuse_odd_bodies_never_a_500(live_server, api_client, settings):
    settings.VERI_WEBHOOKS_ALLOW_PRIVATE = False  # as in production
    http = http_for(live_server, api_client)
    wrong = []
    for method, path, body in [
        *(("PUT", "/secrets/TOKEN", {"value": v}) for v in ODD),
        *(("PUT", f"/secrets/{name}", {"value": "v"}) for name in ("A" * 100, "é", "a b", "..")),
        *(("POST", "/webhook_endpoints", {"url": v}) for v in ODD),
        *(
            ("POST", "/webhook_endpoints", {"url": "https://example.com/h", key: v})
            for key in ("event_types", "description")
            for v in ODD
        ),
        *(("POST", "/webhook_endpoints", {"url": u}) for u in URLS),
    ]:
        response = http.request(method, path, json=body)
        if response.status_code >= 500 or (
            response.status_code >= 400 and "error" not in response.json()
        ):
            wrong.append((method, path[:60], str(body)[:80], response.status_code))
    assert wrong == [], "\n".join(map(str, wrong))
    for url in URLS:
        response = http.post("/webhook_endpoints", json={"url": url})
        assert response.status_code == 400, (url, response.text[:200])


ODD = [None, 0, 2**70, 1.5, "", "x" * 100_000, [], [1], {}, {"a": []}, True, "\x00"]
URLS = [
    "http://127.0.0.1:5432/",
    "http://[::1]/",
    "http://169.254.169.254/latest/meta-data/",
    "http://0x7f000001/",
    "http://2130706433/",
    "http://localhost./",
    "https://exa mple.com/",
    "https://example.com:99999/",
    "file:///etc/passwd",
]


def test_a_pause_read_before_the_run_completed_does_not_hide_the_model(running):
    """The pause request read its job while training; the worker's completion committed before
    the pause wrote: the job stays succeeded and its model listed."""
    client, job_id, job = running
    read_by_the_pause = job_services.get_job(workspace=job.workspace, job_id=job_id)
    worker.complete(job=job, ok=True, error_code=None, message="")
    with pytest.raises(Conflict):
        job_services.pause(ft=read_by_the_pause)
    done = client.fine_tuning.jobs.retrieve(job_id)
    assert done.status == "succeeded"
    assert client.models.retrieve(done.fine_tuned_model).id == done.fine_tuned_model
