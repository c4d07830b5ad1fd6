"""`/v1/webhook_endpoints`: the secret is answered once, URLs are checked, another workspace's
endpoint is not found, and the delivery log shows every attempt."""

import pytest

from tests.conftest import assert_error
from webhooks import tasks
from webhooks.models import WebhookDelivery, WebhookEndpoint

pytestmark = pytest.mark.django_db


def create(api_client, **fields) -> dict:
    body = {"url": "https://example.com/hook", **fields}
    response = api_client.post("/v1/webhook_endpoints", body, format="json")
    assert response.status_code == 201, response.json()
    return response.json()


def test_the_secret_is_answered_at_creation_only(api_client):
    created = create(api_client, event_types=["training_job.failed"], description="pager")
    assert created["signing_secret"].startswith("whsec_")
    assert created["signing_secret_hint"] == f"whsec_…{created['signing_secret'][-4:]}"
    assert (created["object"], created["enabled"]) == ("webhook_endpoint", True)
    assert (created["event_types"], created["description"]) == (["training_job.failed"], "pager")

    fetched = api_client.get(f"/v1/webhook_endpoints/{created['id']}").json()
    [listed] = api_client.get("/v1/webhook_endpoints").json()["data"]
    for shown in (fetched, listed):
        assert "signing_secret" not in shown
        assert created["signing_secret"] not in str(shown)
        assert shown["id"] == created["id"]


def test_rotating_answers_a_new_secret(api_client):
    created = create(api_client)
    rotated = api_client.post(f"/v1/webhook_endpoints/{created['id']}/rotate_secret").json()
    assert rotated["signing_secret"].startswith("whsec_")
    assert rotated["signing_secret"] != created["signing_secret"]
    assert rotated["signing_secret_hint"] != created["signing_secret_hint"]


@pytest.mark.parametrize(
    "url",
    [
        "ftp://example.com/hook",
        "example.com/hook",
        "file:///etc/passwd",
        "https://u:p@example.com/",
    ],
)
def test_only_http_urls_are_taken(api_client, url):
    response = api_client.post("/v1/webhook_endpoints", {"url": url}, format="json")
    assert_error(response, 400, "invalid_webhook_url", field="url")
    assert not WebhookEndpoint.objects.exists()


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:8000/hook",
        "http://localhost/hook",
        "http://10.1.2.3/hook",
        "http://169.254.169.254/latest/meta-data",
        "http://[::1]/hook",
    ],
)
def test_production_refuses_private_addresses(api_client, settings, url):
    settings.VERI_WEBHOOKS_ALLOW_PRIVATE = False
    response = api_client.post("/v1/webhook_endpoints", {"url": url}, format="json")
    assert_error(response, 400, "invalid_webhook_url", field="url")


def test_a_private_address_is_not_posted_to_once_refused(api_client, settings, workspace):
    """An endpoint registered while allowed (or a name that later resolves privately) is not
    posted to: the attempt is logged as refused."""
    created = create(api_client, url="http://127.0.0.1:9/hook")
    settings.VERI_WEBHOOKS_ALLOW_PRIVATE = False
    api_client.post(f"/v1/webhook_endpoints/{created['id']}/test")
    tasks.deliver(WebhookDelivery.objects.get().pk)
    [delivery] = api_client.get(f"/v1/webhook_endpoints/{created['id']}/deliveries").json()["data"]
    assert "not a public address" in delivery["attempts"][0]["error"]


def test_update_changes_what_is_given(api_client):
    created = create(api_client, event_types=["training_job.failed"])
    response = api_client.patch(
        f"/v1/webhook_endpoints/{created['id']}",
        {"url": "https://example.org/new", "event_types": [], "enabled": False},
        format="json",
    )
    assert response.status_code == 200, response.json()
    updated = response.json()
    assert (updated["url"], updated["event_types"], updated["enabled"]) == (
        "https://example.org/new",
        [],
        False,
    )
    assert updated["description"] == created["description"]
    bad = api_client.patch(
        f"/v1/webhook_endpoints/{created['id']}", {"url": "gopher://x"}, format="json"
    )
    assert_error(bad, 400, "invalid_webhook_url", field="url")


def test_test_event_and_the_delivery_log(api_client, receiver):
    created = create(api_client, url=receiver.url, event_types=["training_job.failed"])
    receiver.answers = [500]
    response = api_client.post(f"/v1/webhook_endpoints/{created['id']}/test")
    assert response.status_code == 202, response.json()
    queued = response.json()
    assert (queued["type"], queued["status"], queued["attempts"]) == ("webhook.test", "pending", [])
    delivery = WebhookDelivery.objects.get()
    tasks.deliver(delivery.pk)
    WebhookDelivery.objects.filter(pk=delivery.pk).update(next_attempt_at=delivery.created_at)
    tasks.deliver(delivery.pk)

    [shown] = api_client.get(f"/v1/webhook_endpoints/{created['id']}/deliveries").json()["data"]
    assert shown["id"] == queued["id"] and shown["id"].startswith("evt_")
    assert (shown["status"], shown["attempt_count"], shown["last_status_code"]) == (
        "delivered",
        2,
        200,
    )
    assert [a["status_code"] for a in shown["attempts"]] == [500, 200]
    assert shown["attempts"][0]["response_excerpt"] == "answered 500"
    assert shown["payload"]["type"] == "webhook.test"
    assert shown["payload"]["data"]["id"] == created["id"]


def test_delete_removes_the_endpoint_and_its_log(api_client):
    created = create(api_client)
    api_client.post(f"/v1/webhook_endpoints/{created['id']}/test")
    response = api_client.delete(f"/v1/webhook_endpoints/{created['id']}")
    assert response.status_code == 204
    assert_error(api_client.get(f"/v1/webhook_endpoints/{created['id']}"), 404, "not_found")
    assert not WebhookDelivery.objects.exists()


def test_every_webhook_endpoint_route_hides_other_workspaces(api_client, other_api_client):
    eid = create(api_client)["id"]
    calls = [
        ("get", f"/v1/webhook_endpoints/{eid}", None),
        ("patch", f"/v1/webhook_endpoints/{eid}", {"enabled": False}),
        ("delete", f"/v1/webhook_endpoints/{eid}", None),
        ("post", f"/v1/webhook_endpoints/{eid}/rotate_secret", {}),
        ("post", f"/v1/webhook_endpoints/{eid}/test", {}),
        ("get", f"/v1/webhook_endpoints/{eid}/deliveries", None),
    ]
    for method, url, body in calls:
        response = getattr(other_api_client, method)(url, body, format="json")
        assert_error(response, 404, "not_found")
    assert other_api_client.get("/v1/webhook_endpoints").json()["data"] == []
    endpoint = WebhookEndpoint.objects.get()
    assert endpoint.enabled and not WebhookDelivery.objects.exists()


def test_a_misspelt_event_type_is_refused_naming_the_types(api_client):
    response = api_client.post(
        "/v1/webhook_endpoints",
        {"url": "https://example.org/h", "event_types": ["training_job.complete"]},
        format="json",
    )
    error = assert_error(response, 400, "unknown_event_type", "event_types")
    assert "training_job.completed" in error["message"]
