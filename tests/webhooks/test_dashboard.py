"""The dashboard's Webhooks pages: add an endpoint (its secret shown once), send a test event,
read each delivery's attempts, delete; another workspace's endpoint is a 404."""

import re

import pytest

from veri import services as veri_services
from webhooks import services, tasks
from webhooks.models import WebhookDelivery, WebhookEndpoint

pytestmark = pytest.mark.django_db


def test_add_test_read_and_delete_an_endpoint(browser, receiver):
    response = browser.post(
        "/webhooks/",
        {"url": receiver.url, "event_types": ["training_job.failed", "training_job.cancelled"]},
        follow=True,
    )
    page = response.content.decode()
    [secret] = re.findall(r"data-new-secret>(whsec_[^<]+)<", page)
    endpoint = WebhookEndpoint.objects.get()
    assert endpoint.event_types == ["training_job.cancelled", "training_job.failed"]
    assert "whsec_" not in browser.get("/webhooks/").content.decode().replace(
        endpoint.secret_hint, ""
    )  # shown once: the next visit has the hint only

    response = browser.post(f"/webhooks/{endpoint.public_id}/test/", follow=True)
    assert "Queued a webhook.test event" in response.content.decode()
    receiver.answers = [500]
    delivery = WebhookDelivery.objects.get()
    tasks.deliver(delivery.pk)
    page = browser.get(f"/webhooks/{endpoint.public_id}/").content.decode()
    assert "webhook.test" in page and "HTTP 500" in page and "answered 500" in page
    assert "status-pending" in page
    WebhookDelivery.objects.filter(pk=delivery.pk).update(next_attempt_at=delivery.created_at)
    tasks.deliver(delivery.pk)
    page = browser.get(f"/webhooks/{endpoint.public_id}/").content.decode()
    assert "status-delivered" in page and "HTTP 200" in page
    assert services.signing.unseal(endpoint.secret_sealed) == secret

    response = browser.post(f"/webhooks/{endpoint.public_id}/delete/", follow=True)
    assert "Deleted the webhook endpoint" in response.content.decode()
    assert not WebhookEndpoint.objects.exists()


def test_a_refused_url_is_shown_next_to_the_field(browser):
    response = browser.post("/webhooks/", {"url": "ftp://example.com/x"})
    assert response.status_code == 400
    assert "must be an http:// or https:// URL" in response.content.decode()
    assert not WebhookEndpoint.objects.exists()


def test_another_workspaces_endpoint_is_not_found(browser):
    other, _ = veri_services.create_workspace(name="other")
    theirs, _ = services.create_endpoint(workspace=other, url="https://example.com/theirs")
    assert browser.get(f"/webhooks/{theirs.public_id}/").status_code == 404
    for action in ("test", "delete"):
        assert browser.post(f"/webhooks/{theirs.public_id}/{action}/").status_code == 404
    assert "example.com/theirs" not in browser.get("/webhooks/").content.decode()
    assert WebhookEndpoint.objects.filter(pk=theirs.pk).exists()
    assert not WebhookDelivery.objects.exists()


def test_operators_read_the_delivery_log_in_the_admin_without_the_secret(
    admin_client, workspace, receiver
):
    endpoint, secret = services.create_endpoint(workspace=workspace, url=receiver.url)
    delivery = services.send_test(endpoint=endpoint)
    tasks.deliver(delivery.pk)
    pages = [
        admin_client.get("/admin/webhooks/webhookendpoint/"),
        admin_client.get(f"/admin/webhooks/webhookendpoint/{endpoint.pk}/change/"),
        admin_client.get("/admin/webhooks/webhookdelivery/"),
        admin_client.get(f"/admin/webhooks/webhookdelivery/{delivery.pk}/change/"),
    ]
    assert [p.status_code for p in pages] == [200] * 4
    assert "answered 200" in pages[3].content.decode()
    for page in pages:
        assert secret not in page.content.decode()
        assert endpoint.secret_sealed not in page.content.decode()
