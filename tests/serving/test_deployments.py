"""Deployments: the one transition function, the API's validation and workspace scoping, the
idle scale-down and the router's answer for a cold or unknown model (OpenAI's error shape)."""

import json
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from serving.models import Deployment, Replica
from serving.services import replicas, states
from serving.services.deployments import Shape, create_deployment
from tests.conftest import assert_error, serve_in_background
from tests.training.conftest import dataset, submit  # noqa: F401, F811 - shared fixtures
from tests.training.test_restarts import running
from tests.training.test_worker_and_jobs_api import upload_checkpoint
from training.services import jobs as job_services
from veri.money import usd

pytestmark = pytest.mark.django_db
BASE = "Qwen/Qwen2.5-0.5B"


@pytest.fixture
def deployment(billed) -> Deployment:
    """A deployment whose first replica is written, its launch not run (no commit here)."""
    return create_deployment(
        workspace=billed, base_model=BASE, adapters=[], shape=Shape(idle_timeout_seconds=60)
    )


def go(deployment: Deployment, to: str, **kwargs) -> Deployment:
    return states.transition(deployment_id=deployment.pk, to=to, **kwargs)


def test_the_states_move_only_along_the_machine_and_each_move_is_an_event(deployment):
    assert deployment.status == "starting"
    for to in ("ready", "scaling_down", "stopped", "starting", "ready"):
        assert go(deployment, to).status == to
    with pytest.raises(states.InvalidTransition):
        go(Deployment.objects.get(pk=deployment.pk), "pending")
    go(deployment, "stopped")
    with pytest.raises(states.InvalidTransition):
        go(deployment, "ready")  # stopped wakes through starting only
    assert Deployment.objects.get(pk=deployment.pk).status == "stopped"  # nothing changed
    events = list(deployment.events.order_by("pk").values_list("type", flat=True))
    assert events == ["created", "starting", "ready", "scaling_down", "stopped"] + [
        "starting",
        "ready",
        "stopped",
    ]


@pytest.mark.parametrize(
    ("code", "attribution"), [("model_load_error", "customer"), ("replica_failed", "platform")]
)
def test_a_failure_takes_its_attribution_from_the_catalog_and_is_final(
    deployment, code, attribution
):
    failed = go(deployment, "failed", error_code=code)
    assert (failed.error_code, failed.error_attribution) == (code, attribution)
    assert failed.events.last().detail["attribution"] == attribution
    for to in ("starting", "ready", "stopped"):
        with pytest.raises(states.InvalidTransition):
            go(deployment, to)


def test_another_workspace_gets_404_for_every_route(api_client, other_api_client, billed):
    created = api_client.post("/v1/deployments", {"base_model": BASE}, format="json")
    assert created.status_code == 201, created.json()
    path = f"/v1/deployments/{created.json()['id']}"
    assert api_client.get(path).json()["status"] == "starting"
    assert_error(other_api_client.get(path), 404, "not_found")
    assert_error(other_api_client.patch(path, {"min_replicas": 1}, format="json"), 404, "not_found")
    assert_error(other_api_client.delete(path), 404, "not_found")
    assert_error(other_api_client.get(f"{path}/events"), 404, "not_found")
    assert other_api_client.get("/v1/deployments").json()["data"] == []
    assert api_client.delete(path).status_code == 204
    assert_error(api_client.get(path), 404, "not_found")


def test_create_refuses_what_it_cannot_serve(api_client, other_api_client, billed):
    def refused(body: dict, code: str, field: str) -> None:
        assert_error(api_client.post("/v1/deployments", body, format="json"), 400, code, field)

    refused({"adapters": ["ft:volume/models/tiny:acme::nope"]}, "model_not_found", "adapters.0")
    refused({}, "invalid_request", "base_model")
    refused(
        {"base_model": BASE, "min_replicas": 3, "max_replicas": 2},
        "invalid_request",
        "min_replicas",
    )
    refused(
        {"base_model": BASE, "idle_timeout_seconds": 1}, "invalid_request", "idle_timeout_seconds"
    )
    refused({"base_model": BASE, "gpu_type": "TPU9"}, "invalid_request", "gpu_type")
    refused({"base_model": BASE, "provider": "nowhere"}, "invalid_request", "provider")
    assert not Deployment.objects.exists()


def test_a_training_jobs_id_deploys_its_final_adapter(api_client, billed, submit):  # noqa: F811
    job, worker = running(submit)
    unfinished = api_client.post("/v1/deployments", {"base_model": job.public_id}, format="json")
    assert "no trained adapter" in assert_error(unfinished, 400, "model_not_found")["message"]
    final = upload_checkpoint(worker, job, 10, final=True)
    job_services.transition_job(job_id=job.pk, to="completed")

    # As `veri deploy JOB_ID` sends it: the job's adapter on its base, not a hub model's name.
    created = api_client.post("/v1/deployments", {"base_model": job.public_id}, format="json")
    assert created.status_code == 201, created.json()
    assert created.json()["base_model"] == job.base_model
    assert created.json()["adapters"] == [{"name": final["id"], "checkpoint_id": final["id"]}]

    unknown = api_client.post("/v1/deployments", {"adapters": ["job_nope"]}, format="json")
    error = assert_error(unknown, 400, "model_not_found", "adapters.0")
    assert "not a training job of this workspace" in error["message"]


def test_a_base_model_the_provider_cannot_load_is_refused_at_create(api_client, billed):
    refused = api_client.post("/v1/deployments", {"base_model": "acme/uncached"}, format="json")
    error = assert_error(refused, 400, "base_model_unavailable", "base_model")
    assert "HF_HUB_OFFLINE" in error["message"]
    assert not Deployment.objects.exists()


def test_a_name_already_served_is_not_deployed_twice(api_client, billed):
    first = api_client.post("/v1/deployments", {"base_model": BASE}, format="json").json()
    again = api_client.post("/v1/deployments", {"base_model": BASE}, format="json")
    error = assert_error(again, 409, "already_deployed")
    assert error["deployment_id"] == first["id"] and first["id"] in error["message"]
    assert Deployment.objects.count() == 1
    states.transition(deployment_id=Deployment.objects.get().pk, to="failed")
    # A failed deployment serves nothing: the name deploys again.
    redeployed = api_client.post("/v1/deployments", {"base_model": BASE}, format="json")
    assert redeployed.status_code == 201


def test_idle_deployments_scale_to_zero_once_whoever_runs_the_task(deployment):
    replica = deployment.replicas.get()
    replicas.mark_ready(replica=replica, url="http://127.0.0.1:9")
    now = timezone.now()
    assert replicas.scale_idle(now=now) == 0  # active just now
    later = now + timedelta(seconds=61)
    assert replicas.scale_idle(now=later) == 1
    assert replicas.scale_idle(now=later) == 0  # a second run finds nothing to do
    deployment.refresh_from_db()
    replica.refresh_from_db()
    assert deployment.status == "stopped"
    assert (replica.status, replica.token_hash) == ("stopped", "")  # its token died with it
    kinds = list(deployment.events.order_by("pk").values_list("type", flat=True))
    assert kinds[-3:] == ["scaling_down", "replica_stopped", "stopped"]


def test_min_replicas_are_kept_when_idle(deployment):
    replicas.mark_ready(replica=deployment.replicas.get(), url="http://127.0.0.1:9")
    Deployment.objects.filter(pk=deployment.pk).update(min_replicas=1)
    assert replicas.scale_idle(now=timezone.now() + timedelta(hours=1)) == 0
    assert Deployment.objects.get(pk=deployment.pk).status == "ready"


def test_inference_for_an_unknown_model_or_a_cold_one_answers_in_openais_shape(
    api_client, deployment, settings
):
    settings.VERI_SERVING_WAIT_SECONDS = 0
    unknown = api_client.post(
        "/v1/chat/completions", {"model": "ft:nope", "messages": []}, format="json"
    )
    assert unknown.status_code == 404
    assert unknown.json()["error"] == {
        "message": unknown.json()["error"]["message"],
        "type": "invalid_request_error",
        "param": "model",
        "code": "model_not_found",
    }
    replicas.stop_replicas(deployment=deployment, reason="idle")
    states.transition(deployment_id=deployment.pk, to="stopped")
    cold = api_client.post("/v1/completions", {"model": BASE, "prompt": "x"}, format="json")
    assert cold.status_code == 503 and int(cold["Retry-After"]) > 0
    assert cold.json()["error"]["code"] == "model_starting"
    # The request woke it: a new replica is starting.
    assert Deployment.objects.get(pk=deployment.pk).status == "starting"
    assert Replica.objects.filter(deployment=deployment, status="starting").count() == 1


def test_uptime_is_charged_per_second_from_ready_once_and_never_for_a_replica_never_ready(
    deployment, workspace
):
    from billing.models import LedgerEntry

    replica = deployment.replicas.get()
    replicas.mark_ready(replica=replica, url="http://127.0.0.1:9")
    ready_at = timezone.now() - timedelta(hours=1, seconds=90)
    Replica.objects.filter(pk=replica.pk).update(ready_at=ready_at)
    replica.refresh_from_db()
    hour = replica.price_per_hour_micros
    assert hour > 0
    # Hourly charges of a running replica: nothing due before its first hour.
    assert replicas.charge_running(now=ready_at + timedelta(minutes=59)) == 0
    assert replicas.charge_running(now=ready_at + timedelta(hours=1)) == 1
    assert replicas.charge_running(now=ready_at + timedelta(hours=1)) == 0  # a rerun: nothing
    replicas.stop_replicas(deployment=deployment, reason="idle")
    replica.refresh_from_db()
    charges = list(LedgerEntry.objects.filter(workspace=workspace, kind="deployment_charge"))
    assert len(charges) == 2
    seconds = (replica.stopped_at - ready_at).total_seconds()
    assert sum(c.amount_micros for c in charges) == pytest.approx(-hour * seconds / 3600, abs=2)
    # A replica that never became ready, failed: nothing charged.
    states.transition(deployment_id=deployment.pk, to="stopped")
    second = replicas.start_replica(deployment=deployment)
    replicas.fail_replica(replica=second, code="replica_start_timeout")
    assert LedgerEntry.objects.filter(kind="deployment_charge").count() == 2


class DyingReplica(BaseHTTPRequestHandler):
    """A serving process that dies mid-answer: one chunk of a stream, then its connection
    closes."""

    protocol_version = "HTTP/1.0"

    def do_POST(self):  # noqa: N802 - the base class's name
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        self.wfile.write(b'data: {"choices": [{"index": 0, "delta": {"content": "pl"}}]}\n\n')

    def log_message(self, *args):
        pass


@pytest.fixture
def dying_replica():
    server = ThreadingHTTPServer(("127.0.0.1", 0), DyingReplica)
    serve_in_background(server)
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_a_replica_dying_mid_stream_ends_the_stream_with_an_error_and_is_failed(
    api_client, deployment, dying_replica
):
    replica = deployment.replicas.get()
    replicas.mark_ready(replica=replica, url=dying_replica)
    body = {"model": BASE, "messages": [{"role": "user", "content": "x"}], "stream": True}
    response = api_client.post("/v1/chat/completions", body, format="json")
    assert response.status_code == 200
    events = b"".join(response.streaming_content).decode().split("\n\n")
    assert events[0].startswith("data: ") and "pl" in events[0]
    error = json.loads(events[1].removeprefix("data: "))["error"]
    assert error["code"] == "replica_failed" and error["type"] == "server_error"
    replica.refresh_from_db()
    assert (replica.status, replica.error_code) == ("failed", "replica_failed")
    assert Deployment.objects.get(pk=deployment.pk).status == "stopped"  # the next request wakes it


def test_an_unreachable_replica_is_failed_and_the_request_told_to_retry(api_client, deployment):
    replica = deployment.replicas.get()
    replicas.mark_ready(replica=replica, url="http://127.0.0.1:9")  # nothing listens there
    response = api_client.post("/v1/completions", {"model": BASE, "prompt": "x"}, format="json")
    assert response.status_code == 503 and int(response["Retry-After"]) > 0
    assert response.json()["error"]["code"] == "model_starting"
    replica.refresh_from_db()
    assert replica.status == "failed"
    # A new replica is on its way for the retry.
    assert Deployment.objects.get(pk=deployment.pk).status == "starting"
    assert deployment.replicas.filter(status="starting").count() == 1


def test_a_replica_cannot_point_the_router_off_its_machine(deployment):
    replica = deployment.replicas.get()
    worker = APIClient()
    worker.credentials(HTTP_AUTHORIZATION=f"Bearer {replicas.mint_token(replica=replica)}")
    ready = f"/v1/worker/replicas/{replica.public_id}/ready"
    for elsewhere in (
        "http://169.254.169.254/latest",
        "http://10.0.0.7:8000",
        "http://example.com",
    ):
        answer = worker.post(ready, {"url": elsewhere}, format="json")
        assert answer.status_code == 400 and answer.json()["error"]["field"] == "url"
    replica.refresh_from_db()
    assert replica.status == "starting" and not replica.url
    assert worker.post(ready, {"url": "http://127.0.0.1:8123"}, format="json").status_code == 200
    replica.refresh_from_db()
    assert replica.status == "ready" and replica.url == "http://127.0.0.1:8123"


def test_a_replica_the_platform_lost_is_charged_up_to_the_loss_then_credited(
    api_client, deployment
):
    from billing.models import LedgerEntry

    replica = deployment.replicas.get()
    replicas.mark_ready(replica=replica, url="http://127.0.0.1:9")
    ready_at = timezone.now() - timedelta(hours=1, minutes=30)
    Replica.objects.filter(pk=replica.pk).update(ready_at=ready_at)
    assert replicas.charge_running(now=ready_at + timedelta(hours=1)) == 1  # its first hour
    replica.refresh_from_db()
    replicas.fail_replica(replica=replica, code="replica_failed", message="machine gone")
    replica.refresh_from_db()
    first, last = LedgerEntry.objects.filter(kind="deployment_charge").order_by("pk")
    [credit] = LedgerEntry.objects.filter(kind="refund_credit")
    # The half hour since the last charge: charged, then credited (the catalog: platform, refund).
    lost = (replica.stopped_at - ready_at - timedelta(hours=1)).total_seconds()
    hour = replica.price_per_hour_micros
    assert last.amount_micros == pytest.approx(-hour * lost / 3600, abs=2)
    assert credit.amount_micros == -last.amount_micros
    assert first.amount_micros == pytest.approx(-hour, abs=2)  # the hour before stays charged
    assert "replica_failed" in credit.description
    replicas.fail_replica(replica=replica, code="replica_failed")  # a second report: nothing new
    assert LedgerEntry.objects.filter(kind__in=["deployment_charge", "refund_credit"]).count() == 3
    # GET /v1/billing shows what deployments were charged.
    spend = api_client.get("/v1/billing").json()["spend_usd"]
    assert spend["deployments"] == usd(-first.amount_micros - last.amount_micros)
    assert spend["jobs"] == spend["storage"] == usd(0)


def test_a_spent_balance_stops_the_deployment_and_inference_answers_402_until_a_top_up(
    api_client, deployment, settings
):
    from billing.services import add_credit, balance_micros

    replica = deployment.replicas.get()
    replicas.mark_ready(replica=replica, url="http://127.0.0.1:9")
    assert replicas.stop_unfunded(now=timezone.now()) == 0  # funded
    workspace = deployment.workspace
    spend = balance_micros(workspace=workspace)
    add_credit(workspace=workspace, amount_micros=-spend, reason="spent", key="spent")
    assert replicas.stop_unfunded(now=timezone.now()) == 1
    assert replicas.stop_unfunded(now=timezone.now()) == 0  # a rerun: nothing more
    deployment.refresh_from_db()
    replica.refresh_from_db()
    assert (deployment.status, replica.status) == ("stopped", "stopped")
    assert "Ask an operator for credit" in deployment.error_message  # no card payments here
    assert api_client.get(f"/v1/deployments/{deployment.public_id}").json()["error"] == {
        "code": "balance_exhausted",
        "message": deployment.error_message,
        "attribution": "customer",
    }
    kinds = list(deployment.events.order_by("pk").values_list("type", flat=True))
    assert kinds[-3:] == ["scaling_down", "replica_stopped", "stopped"]
    # Inference: 402 in OpenAI's shape, and nothing woken.
    settings.VERI_SERVING_WAIT_SECONDS = 0
    answer = api_client.post("/v1/completions", {"model": BASE, "prompt": "x"}, format="json")
    assert answer.status_code == 402
    assert answer.json()["error"]["code"] == "insufficient_balance"
    assert answer.json()["error"]["type"] == "insufficient_quota"
    assert "deployments are stopped" in answer.json()["error"]["message"]
    assert "ask an operator for credit" in answer.json()["error"]["message"].lower()
    assert not deployment.replicas.filter(status="starting").exists()
    # Topped up, the next request wakes it, its stop reason cleared.
    add_credit(workspace=workspace, amount_micros=5_000_000, reason="top-up", key="top-up")
    cold = api_client.post("/v1/completions", {"model": BASE, "prompt": "x"}, format="json")
    assert cold.status_code == 503 and cold.json()["error"]["code"] == "model_starting"
    deployment.refresh_from_db()
    assert (deployment.status, deployment.error_code) == ("starting", "")


def test_creating_a_deployment_needs_funds(api_client, workspace, settings):
    body = {"base_model": BASE}
    assert_error(
        api_client.post("/v1/deployments", body, format="json"), 402, "billing_account_required"
    )
    from billing.services import open_billing_account

    open_billing_account(workspace=workspace)
    error = assert_error(
        api_client.post("/v1/deployments", body, format="json"), 402, "insufficient_balance"
    )
    # No deployment is stopped, and card top-ups are off without Stripe: say what to do.
    assert error["message"].startswith("The balance is 0.00 USD: deploying needs a positive")
    assert "operator" in error["message"] and "veri billing top-up" not in error["message"]
    assert "stopped" not in error["message"]
    settings.STRIPE_SECRET_KEY = "sk_test_veri"  # payments on: the card top-up is the way
    error = assert_error(
        api_client.post("/v1/deployments", body, format="json"), 402, "insufficient_balance"
    )
    assert "veri billing top-up AMOUNT" in error["message"]
    assert not Deployment.objects.exists()


def test_models_lists_what_the_workspaces_deployments_serve(api_client, other_api_client, billed):
    custom = create_deployment(
        workspace=billed, base_model="acme/custom-base", adapters=[], shape=Shape()
    )
    Deployment.objects.filter(pk=custom.pk).update(
        adapters=[{"name": "ckpt-tuned", "checkpoint_id": "ckpt-tuned"}]
    )
    failed = create_deployment(
        workspace=billed, base_model="acme/broken", adapters=[], shape=Shape()
    )
    states.transition(deployment_id=failed.pk, to="failed", error_code="model_load_error")
    listed = {m["id"] for m in api_client.get("/v1/models").json()["data"]}
    assert {"acme/custom-base", "ckpt-tuned"} <= listed and "acme/broken" not in listed
    assert api_client.get("/v1/models/ckpt-tuned").json()["id"] == "ckpt-tuned"
    others = {m["id"] for m in other_api_client.get("/v1/models").json()["data"]}
    assert not others & {"acme/custom-base", "ckpt-tuned"}
    assert other_api_client.get("/v1/models/ckpt-tuned").status_code == 404
