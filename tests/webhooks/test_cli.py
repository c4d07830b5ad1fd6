"""`veri webhooks …` and `client.webhooks` against a live control plane."""

import pytest

from veri_sdk import Client, NotFoundError
from webhooks import tasks
from webhooks.models import WebhookDelivery

pytestmark = pytest.mark.django_db(transaction=True)


def test_register_test_read_the_log_and_delete(cli, capsys, receiver):
    code, out, err = cli(
        "webhooks", "create", receiver.url, "--event", "training_job.failed", capsys=capsys
    )
    assert code == 0, err
    endpoint_id, secret = out.split()[0], out.splitlines()[-1]
    assert endpoint_id.startswith("we_") and secret.startswith("whsec_")

    code, out, err = cli("webhooks", "list", capsys=capsys)
    assert code == 0, err
    assert endpoint_id in out and "training_job.failed" in out and secret not in out

    code, out, err = cli("webhooks", "test", endpoint_id, capsys=capsys)
    assert code == 0 and "webhook.test" in out, err
    tasks.deliver(WebhookDelivery.objects.get().pk)
    code, out, err = cli("webhooks", "deliveries", endpoint_id, capsys=capsys)
    assert code == 0, err
    [row] = [line for line in out.splitlines() if "webhook.test" in line]
    assert "delivered" in row and "200" in row
    assert len(receiver.requests) == 1

    assert cli("webhooks", "delete", endpoint_id, capsys=capsys)[0] == 0
    code, out, err = cli("webhooks", "deliveries", endpoint_id, capsys=capsys)
    assert code == 1 and "No webhook endpoint" in err


def test_the_sdk_covers_every_route(cli, receiver):
    client = Client(api_key=cli.key, base_url=cli.url)
    created = client.webhooks.create(receiver.url, description="ops")
    assert created["signing_secret"].startswith("whsec_")
    assert [e["id"] for e in client.webhooks.list()] == [created["id"]]
    assert client.webhooks.update(created["id"], enabled=False)["enabled"] is False
    assert client.webhooks.get(created["id"])["description"] == "ops"
    rotated = client.webhooks.rotate_secret(created["id"])
    assert rotated["signing_secret"] != created["signing_secret"]
    delivery = client.webhooks.test(created["id"])
    assert client.webhooks.deliveries(created["id"])[0]["id"] == delivery["id"]
    client.webhooks.delete(created["id"])
    with pytest.raises(NotFoundError):
        client.webhooks.get(created["id"])
