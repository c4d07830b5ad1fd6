"""Deployments in the dashboard through Django's test client: the list and a deployment's page
(status, the catalog's error when failed, replicas, events, cost so far), its settings edited and
Delete, the Deploy button of a succeeded job, deployment spend on the billing page, another
workspace's deployments and models 404, and the playground's chat endpoint (session and CSRF,
errors as JSON, a cold model told to retry, a ready one streamed through)."""

import html
import json
import re
import threading
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.test import Client
from django.utils import timezone

from billing.models import LedgerEntry
from billing.services import open_billing_account
from dashboard.templatetags.dashboard import money
from serving.models import Deployment, Replica
from serving.services import replicas, states
from serving.services.deployments import Shape, create_deployment
from tests.dashboard.conftest import signed_in
from tests.training.test_restarts import running
from tests.training.test_worker_and_jobs_api import upload_checkpoint
from training.services import jobs as job_services
from veri import services as veri_services

pytestmark = pytest.mark.django_db
BASE = "Qwen/Qwen2.5-0.5B"
QUESTION = [{"role": "user", "content": "Name a fruit."}]


@pytest.fixture
def deployment(billed) -> Deployment:
    """A deployment of the owner's workspace, its first replica written (its launch not run)."""
    return create_deployment(
        workspace=billed, base_model=BASE, adapters=[], shape=Shape(idle_timeout_seconds=60)
    )


@pytest.fixture
def others() -> Deployment:
    other, _ = veri_services.create_workspace(name="other")
    open_billing_account(workspace=other, credit_micros=10_000_000)  # deploying needs funds
    return create_deployment(workspace=other, base_model="other/model", adapters=[], shape=Shape())


def text(response) -> str:
    return html.unescape(response.content.decode())


def chat(client: Client, model: str, **fields):
    body = {"model": model, "messages": QUESTION, "max_tokens": 8} | fields
    return client.post("/playground/chat/", json.dumps(body), content_type="application/json")


def test_the_list_and_a_deployments_page_show_its_state(browser, deployment):
    listed = text(browser.get("/deployments/"))
    assert deployment.public_id in listed and BASE in listed
    assert "starting" in listed and "1 of 0–1" in listed  # one live replica of 0 to 1

    page = text(browser.get(f"/deployments/{deployment.public_id}/"))
    replica = deployment.replicas.get()
    assert replica.public_id in page and "created" in page and "starting" in page
    assert 'value="60"' in page  # the idle timeout, in the settings form
    assert "/playground/?model=Qwen%2FQwen2.5-0.5B" in page
    assert "Deployments</a>" in text(browser.get("/jobs/"))  # in the navigation
    status = browser.get(f"/deployments/{deployment.public_id}/status.json")
    assert status.json() == {"status": "starting"}  # what its page polls while it starts
    # Ready without a request: the time shown is its ready time, not called a request's.
    replicas.mark_ready(replica=replica, url="http://127.0.0.1:9")
    page = text(browser.get(f"/deployments/{deployment.public_id}/"))
    assert "<h3" in page and "Last active</h3>" in page and "Last request" not in page


def test_the_playground_opens_with_both_panes_filled(browser, deployment, billed):
    """From the Deployments page's link (no query): the newest deployment's first adapter beside
    its base, as its own "Open in the playground" link has them."""
    page = text(browser.get("/playground/"))
    assert f'name="model" value="{BASE}"' in page
    assert f'name="baseline" value="{BASE}"' in page  # not an empty second pane
    asked = text(browser.get("/playground/?model=Qwen/Qwen2.5-0.5B"))
    assert 'name="baseline" value=""' in asked  # a link's own choice is kept


def test_a_failed_deployment_shows_the_catalogs_error(browser, deployment):
    states.transition(deployment_id=deployment.pk, to="failed", error_code="model_load_error")
    page = text(browser.get(f"/deployments/{deployment.public_id}/"))
    assert "Failed: <code>model_load_error</code>" in page
    assert "<dd data-attribution>customer</dd>" in page
    assert "cannot change" in page and "data-settings" not in page


def test_settings_are_edited_and_refused_when_out_of_bounds(browser, deployment):
    url = f"/deployments/{deployment.public_id}/settings/"
    saved = browser.post(url, {"min_replicas": 0, "max_replicas": 3, "idle_timeout_seconds": 120})
    assert saved.status_code == 302
    deployment.refresh_from_db()
    assert (deployment.max_replicas, deployment.idle_timeout_seconds) == (3, 120)
    assert "updated" in text(browser.get(f"/deployments/{deployment.public_id}/"))

    refused = browser.post(url, {"min_replicas": 3, "max_replicas": 2, "idle_timeout_seconds": 5})
    assert refused.status_code == 400
    assert "idle_timeout" in text(refused) and 'role="alert"' in text(refused)
    deployment.refresh_from_db()
    assert (deployment.min_replicas, deployment.idle_timeout_seconds) == (0, 120)


def test_delete_stops_its_replicas_and_removes_it(browser, deployment):
    replica = deployment.replicas.get()
    page = text(browser.get(f"/deployments/{deployment.public_id}/"))
    assert f'data-confirm="Delete {deployment.public_id}?' in page  # asked before it goes
    assert browser.get(f"/deployments/{deployment.public_id}/delete/").status_code == 405
    deleted = browser.post(f"/deployments/{deployment.public_id}/delete/")
    assert deleted.status_code == 302 and deleted["Location"] == "/deployments/"
    assert not Deployment.objects.filter(pk=deployment.pk).exists()
    assert not Replica.objects.filter(pk=replica.pk).exists()
    assert browser.get(f"/deployments/{deployment.public_id}/").status_code == 404


def test_another_workspaces_deployment_and_models_are_not_found(browser, deployment, others):
    assert others.public_id not in text(browser.get("/deployments/"))
    base = f"/deployments/{others.public_id}/"
    assert browser.get(base).status_code == 404
    assert browser.get(f"{base}status.json").status_code == 404
    assert browser.post(f"{base}settings/", {"min_replicas": 1}).status_code == 404
    assert browser.post(f"{base}delete/").status_code == 404
    assert Deployment.objects.filter(pk=others.pk).exists()
    assert "other/model" not in text(browser.get("/playground/"))
    answer = chat(browser, "other/model")
    assert answer.status_code == 404 and answer.json()["error"]["code"] == "model_not_found"


def test_the_playground_chat_needs_the_session_and_csrf_and_answers_errors_as_json(
    owner, deployment, settings
):
    assert chat(Client(), BASE).status_code == 302  # to the sign-in page
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(owner)
    assert chat(strict, BASE).status_code == 403  # no CSRF token

    client = signed_in(owner)
    unknown = chat(client, "ft:nope")
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "model_not_found"
    bad = client.post("/playground/chat/", "[1]", content_type="application/json")
    assert bad.status_code == 400 and bad.json()["error"]["message"]

    # Cold: told to retry while its replica starts (the request woke it).
    settings.VERI_SERVING_WAIT_SECONDS = 0
    replicas.stop_replicas(deployment=deployment, reason="idle")
    states.transition(deployment_id=deployment.pk, to="stopped")
    cold = chat(client, BASE)
    assert cold.status_code == 503 and int(cold["Retry-After"]) > 0
    assert cold.json()["error"]["code"] == "model_starting"
    assert Deployment.objects.get(pk=deployment.pk).status == "starting"

    failed = states.transition(deployment_id=deployment.pk, to="failed", error_code="oom")
    answer = chat(client, BASE)
    assert answer.status_code == 400 and answer.json()["error"]["code"] == "deployment_failed"
    assert failed.public_id in answer.json()["error"]["message"]


class Replying(BaseHTTPRequestHandler):
    """A serving process answering a streamed chat in two events, keeping what it was asked."""

    asked: list = []

    def do_POST(self):  # noqa: N802 - the base class's name
        Replying.asked.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for piece in ("plum", " plum"):
            event = {"choices": [{"index": 0, "delta": {"content": piece}}]}
            self.wfile.write(f"data: {json.dumps(event)}\n\n".encode())
        self.wfile.write(b"data: [DONE]\n\n")

    def log_message(self, *args):
        pass


def test_the_playground_chat_streams_the_replicas_answer(browser, deployment):
    server = ThreadingHTTPServer(("127.0.0.1", 0), Replying)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        replicas.mark_ready(replica=deployment.replicas.get(), url=url)
        Replying.asked = []
        answer = chat(browser, BASE, temperature=0, stream=False, seed=1)
        assert answer.status_code == 200 and answer["Content-Type"] == "text/event-stream"
        events = b"".join(answer.streaming_content).decode().split("\n\n")
    finally:
        server.shutdown()
    assert [json.loads(e[6:])["choices"][0]["delta"]["content"] for e in events[:2]] == [
        "plum",
        " plum",
    ]
    # Streamed, with what the pane asked for and nothing else it sent.
    assert Replying.asked == [
        {"model": BASE, "messages": QUESTION, "max_tokens": 8, "temperature": 0, "stream": True}
    ]


def test_spend_shows_on_the_billing_page_and_the_deployments(browser, deployment, billed):
    replica = deployment.replicas.get()
    replicas.mark_ready(replica=replica, url="http://127.0.0.1:9")
    Replica.objects.filter(pk=replica.pk).update(ready_at=timezone.now() - timedelta(hours=2))
    replica.refresh_from_db()
    # Running, nothing charged yet: its cost so far is its uptime at its price.
    page = text(browser.get(f"/deployments/{deployment.public_id}/"))
    shown = float(re.search(r"<p data-cost>([0-9.]+) USD</p>", page)[1])
    assert shown == pytest.approx(2 * replica.price_per_hour_micros / 1e6, abs=2e-4)
    assert not LedgerEntry.objects.filter(kind="deployment_charge").exists()

    replicas.stop_replicas(deployment=deployment, reason="idle")
    [charge] = LedgerEntry.objects.filter(workspace=billed, kind="deployment_charge")
    spent = money(-charge.amount_micros)
    assert -charge.amount_micros > 0

    billing = text(browser.get("/billing/"))
    assert f'data-spend-kind="deployments"><h3>Deployments</h3><p>{spent}</p>' in billing
    assert 'data-spend-kind="training"><h3>Training</h3><p>0.0000 USD</p>' in billing
    assert f"<p data-cost>{spent}</p>" in text(browser.get(f"/deployments/{deployment.public_id}/"))
    assert spent.removesuffix(" USD") in text(browser.get("/deployments/"))


def test_a_succeeded_jobs_deploy_button_deploys_its_adapter_once(browser, submit):
    job, worker = running(submit)
    assert "data-deploy" not in text(browser.get(f"/jobs/{job.public_id}/"))  # not done yet
    final = upload_checkpoint(worker, job, 10, final=True)
    job_services.transition_job(job_id=job.pk, to="completed")
    assert "data-deploy" in text(browser.get(f"/jobs/{job.public_id}/"))

    deployed = browser.post(f"/jobs/{job.public_id}/deploy/")
    deployment = Deployment.objects.get(workspace=job.workspace)
    assert deployed.status_code == 302
    assert deployed["Location"] == f"/deployments/{deployment.public_id}/"
    assert deployment.base_model == job.base_model and deployment.status == "starting"
    assert deployment.adapters == [{"name": final["id"], "checkpoint_id": final["id"]}]
    assert final["id"] in text(browser.get(deployed["Location"]))

    # Again: the deployment serving it, not a second one.
    again = browser.post(f"/jobs/{job.public_id}/deploy/")
    assert again["Location"] == deployed["Location"]
    assert Deployment.objects.filter(workspace=job.workspace).count() == 1
