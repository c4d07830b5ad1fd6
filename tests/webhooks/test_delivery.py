"""Publishing events into the outbox and delivering them, signed, to a real HTTP endpoint: the
official `openai` client verifies what arrives, a failing endpoint is retried on Standard
Webhooks' schedule, and every attempt is logged."""

from datetime import timedelta

import openai
import pytest
from django.utils import timezone
from openai.types.webhooks import FineTuningJobSucceededWebhookEvent
from standardwebhooks.webhooks import Webhook

from tests.conftest import free_port, in_threads, postgres_only
from tests.training.conftest import drive
from training.services import jobs
from webhooks import services, tasks
from webhooks.models import WebhookDelivery, WebhookEndpoint

pytestmark = pytest.mark.django_db


def openai_client() -> openai.OpenAI:
    return openai.OpenAI(api_key="x", base_url="http://127.0.0.1:1")


def register(api_client, url: str, **fields) -> dict:
    response = api_client.post("/v1/webhook_endpoints", {"url": url, **fields}, format="json")
    assert response.status_code == 201, response.json()
    return response.json()


def due_now(delivery: WebhookDelivery) -> None:
    """The clock reaches the delivery's next attempt."""
    WebhookDelivery.objects.filter(pk=delivery.pk).update(next_attempt_at=timezone.now())


def test_the_openai_client_verifies_a_delivered_event(
    api_client, workspace, receiver, django_capture_on_commit_callbacks
):
    endpoint = register(api_client, receiver.url)
    with django_capture_on_commit_callbacks() as queued:
        services.publish(
            workspace=workspace, event_type="fine_tuning.job.succeeded", data={"id": "ftjob-abc"}
        )
    assert len(queued) == 1  # the delivery task, queued once the publisher commits
    [delivery] = WebhookDelivery.objects.all()
    tasks.deliver(delivery.pk)

    [request] = receiver.requests
    event = openai_client().webhooks.unwrap(
        request["body"], request["headers"], secret=endpoint["signing_secret"]
    )
    assert isinstance(event, FineTuningJobSucceededWebhookEvent)
    assert (event.id, event.type, event.data.id) == (
        delivery.event_id,
        "fine_tuning.job.succeeded",
        "ftjob-abc",
    )
    assert request["headers"]["webhook-id"] == delivery.event_id
    # The reference library verifies it too.
    Webhook(endpoint["signing_secret"]).verify(request["body"], request["headers"])

    with pytest.raises(openai.InvalidWebhookSignatureError):
        wrong = services.signing.new_secret()
        openai_client().webhooks.unwrap(request["body"], request["headers"], secret=wrong)

    delivery.refresh_from_db()
    assert delivery.delivered_at and delivery.last_status_code == 200
    [attempt] = delivery.attempts.all()
    assert (attempt.status_code, attempt.response_excerpt) == (200, "answered 200")


def test_a_failing_endpoint_is_retried_on_the_schedule_then_given_up(
    api_client, workspace, receiver
):
    register(api_client, receiver.url)
    receiver.answers = [500] * services.MAX_ATTEMPTS
    services.publish(workspace=workspace, event_type="training_job.failed", data={"id": "job_x"})
    delivery = WebhookDelivery.objects.get()
    waits = []
    for _ in range(services.MAX_ATTEMPTS):
        tasks.deliver(delivery.pk)
        delivery.refresh_from_db()
        if delivery.failed_at:
            break
        attempt = delivery.attempts.last()  # the wait counts from when its answer came
        answered = attempt.started_at + timedelta(milliseconds=attempt.duration_ms)
        waits.append(round((delivery.next_attempt_at - answered).total_seconds()))
        tasks.deliver(delivery.pk)  # not due yet: nothing is sent
        assert len(receiver.requests) == delivery.attempt_count
        due_now(delivery)
    assert waits == [5, 300, 1800, 7200, 18000, 36000, 36000]
    assert (delivery.status, delivery.attempt_count) == ("failed", 8)
    assert (delivery.last_status_code, delivery.last_error) == (500, "HTTP 500")
    assert [a.status_code for a in delivery.attempts.all()] == [500] * 8
    # Every try posted the same event, freshly signed.
    assert len({r["body"] for r in receiver.requests}) == 1
    assert {r["headers"]["webhook-id"] for r in receiver.requests} == {delivery.event_id}

    tasks.deliver(delivery.pk)  # given up: never sent again
    assert len(receiver.requests) == 8


def test_a_retry_that_succeeds_marks_the_delivery_delivered(
    api_client, workspace, receiver, django_capture_on_commit_callbacks
):
    register(api_client, receiver.url)
    receiver.answers = [500, 503]
    services.publish(workspace=workspace, event_type="training_job.completed", data={"id": "j"})
    delivery = WebhookDelivery.objects.get()
    tasks.deliver(delivery.pk)
    with django_capture_on_commit_callbacks() as queued:
        tasks.deliver_due()
    assert queued == []  # its retry is not due for 5 s
    due_now(delivery)
    with django_capture_on_commit_callbacks(execute=False) as queued:
        tasks.deliver_due()
    assert len(queued) == 1  # the sweep queues the due retry
    tasks.deliver(delivery.pk)
    due_now(delivery)
    tasks.deliver(delivery.pk)

    delivery.refresh_from_db()
    assert delivery.status == "delivered"
    assert [a.status_code for a in delivery.attempts.order_by("pk")] == [500, 503, 200]
    assert len(receiver.requests) == 3


def test_an_unreachable_endpoint_is_logged_and_retried(api_client, workspace):
    register(api_client, f"http://127.0.0.1:{free_port()}/hook")
    services.publish(workspace=workspace, event_type="training_job.completed", data={"id": "j"})
    delivery = WebhookDelivery.objects.get()
    tasks.deliver(delivery.pk)
    delivery.refresh_from_db()
    [attempt] = delivery.attempts.all()
    assert attempt.status_code is None and "ConnectError" in attempt.error
    assert delivery.status == "pending" and delivery.next_attempt_at > timezone.now()


@postgres_only
@pytest.mark.django_db(transaction=True)
def test_a_delivery_run_twice_at_once_is_sent_once(api_client, workspace, receiver):
    register(api_client, receiver.url)
    receiver.delay = 0.5
    services.publish(workspace=workspace, event_type="training_job.completed", data={"id": "j"})
    delivery = WebhookDelivery.objects.get()
    in_threads(4, lambda _: tasks.deliver(delivery.pk))
    assert len(receiver.requests) == 1
    delivery.refresh_from_db()
    assert (delivery.status, delivery.attempt_count, delivery.attempts.count()) == (
        "delivered",
        1,
        1,
    )


def test_publish_without_endpoints_writes_nothing_in_one_query(
    workspace, django_assert_num_queries
):
    with django_assert_num_queries(1):
        services.publish(workspace=workspace, event_type="training_job.completed", data={})
    assert not WebhookDelivery.objects.exists()


def test_only_enabled_endpoints_taking_the_type_get_the_event(api_client, workspace, receiver):
    every = register(api_client, receiver.url)
    failures = register(api_client, receiver.url, event_types=["training_job.failed"])
    off = register(api_client, receiver.url)
    api_client.patch(f"/v1/webhook_endpoints/{off['id']}", {"enabled": False}, format="json")

    services.publish(workspace=workspace, event_type="training_job.completed", data={})
    services.publish(workspace=workspace, event_type="training_job.failed", data={})

    got = {
        (d.endpoint.public_id, d.event_type)
        for d in WebhookDelivery.objects.select_related("endpoint")
    }
    assert got == {
        (every["id"], "training_job.completed"),
        (every["id"], "training_job.failed"),
        (failures["id"], "training_job.failed"),
    }


def test_a_training_job_that_ends_publishes_its_event(api_client, workspace, receiver, submit):
    endpoint = register(api_client, receiver.url)
    job = drive(submit(), "provisioning")
    assert not WebhookDelivery.objects.exists()  # only an end is an event
    jobs.fail_job(job_id=job.pk, code="provisioning_timeout")

    delivery = WebhookDelivery.objects.get()
    tasks.deliver(delivery.pk)
    [request] = receiver.requests
    event = Webhook(endpoint["signing_secret"]).verify(request["body"], request["headers"])
    assert event["type"] == "training_job.failed"
    assert event["data"]["id"] == job.public_id
    assert event["data"]["status"] == "failed"
    assert event["data"]["error"]["code"] == "provisioning_timeout"
    assert set(event["data"]["error"]) == {"code", "message", "attribution"}
    assert set(event) == {"id", "object", "created_at", "type", "data"}
    assert event["object"] == "event"


def test_a_cancelled_job_publishes_training_job_cancelled(api_client, workspace, submit):
    register(api_client, "http://127.0.0.1:9/hook")
    job = submit()
    api_client.post(f"/v1/training_jobs/{job.public_id}/cancel")
    delivery = WebhookDelivery.objects.get()
    assert delivery.event_type == "training_job.cancelled"
    assert '"error":null' in delivery.payload


def test_a_rotated_secret_kept_for_a_day_signs_beside_the_new_one(api_client, workspace, receiver):
    old = register(api_client, receiver.url)
    response = api_client.post(
        f"/v1/webhook_endpoints/{old['id']}/rotate_secret",
        {"keep_old_secret_active_for_24_hours": True},
        format="json",
    )
    new = response.json()["signing_secret"]
    assert new != old["signing_secret"]
    api_client.post(f"/v1/webhook_endpoints/{old['id']}/test")
    tasks.deliver(WebhookDelivery.objects.get().pk)
    [request] = receiver.requests
    for secret in (old["signing_secret"], new):
        event = openai_client().webhooks.verify_signature(
            request["body"], request["headers"], secret=secret
        )
        assert event is None

    # Rotated again without keeping: only the newest verifies.
    newest = api_client.post(f"/v1/webhook_endpoints/{old['id']}/rotate_secret").json()
    api_client.post(f"/v1/webhook_endpoints/{old['id']}/test")
    tasks.deliver(WebhookDelivery.objects.order_by("pk").last().pk)
    request = receiver.requests[-1]
    Webhook(newest["signing_secret"]).verify(request["body"], request["headers"])
    with pytest.raises(openai.InvalidWebhookSignatureError):
        openai_client().webhooks.verify_signature(request["body"], request["headers"], secret=new)


def test_the_secret_is_never_stored_in_clear(api_client, receiver):
    secret = register(api_client, receiver.url)["signing_secret"]
    assert secret.startswith("whsec_") and len(secret) == len("whsec_") + 32
    row = WebhookEndpoint.objects.values().get()
    assert not any(secret in str(value) for value in row.values())
    assert not any(secret[len("whsec_") :] in str(value) for value in row.values())


def test_a_named_host_is_posted_to_at_the_address_checked_with_its_name_as_host(
    api_client, workspace, receiver
):
    port = receiver.server.server_port
    endpoint = register(api_client, f"http://localhost:{port}/hooks/veri?team=ml")
    services.publish(workspace=workspace, event_type="training_job.completed", data={"id": "j"})
    tasks.deliver(WebhookDelivery.objects.get().pk)
    [request] = receiver.requests
    assert request["headers"]["host"] == f"localhost:{port}"
    assert request["path"] == "/hooks/veri?team=ml"
    Webhook(endpoint["signing_secret"]).verify(request["body"], request["headers"])
