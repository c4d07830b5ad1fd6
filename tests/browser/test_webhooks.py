"""The Webhooks pages in a real browser: add an endpoint and copy its secret (shown once), send a
test event, read its attempts, and the pages fit a 375 px phone."""

import pytest
from playwright.sync_api import expect

from tests.browser.test_dashboard import EMAIL, assert_fits_the_screen, screenshots_dir, sign_in
from tests.browser.test_refund_review import browser_page  # noqa: F401 - the Chromium page
from tests.dashboard.conftest import member_of
from tests.webhooks.conftest import receiver  # noqa: F401 - the loopback endpoint
from veri import services
from webhooks import tasks
from webhooks.models import WebhookDelivery

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True, serialized_rollback=True)]


def test_add_an_endpoint_send_a_test_and_read_its_attempts(
    browser_page,  # noqa: F811
    live_server,
    receiver,  # noqa: F811
    tmp_path,
):
    workspace, _ = services.create_workspace(name="acme")
    member_of(workspace, EMAIL)
    page, shots = browser_page, screenshots_dir(tmp_path)
    sign_in(page, live_server.url)
    page.click("nav >> text=Webhooks")
    page.fill("#id_url", receiver.url)
    page.check("input[name=event_types][value='training_job.failed']")
    page.click("button:has-text('Add an endpoint')")
    secret = page.locator("[data-new-secret]").inner_text()
    assert secret.startswith("whsec_")
    page.screenshot(path=str(shots / "webhooks.png"), full_page=True)
    page.reload()
    expect(page.locator("[data-new-secret]")).to_have_count(0)  # shown once

    receiver.answers = [500]
    page.click("button:has-text('Send test')")
    expect(page.locator("h1")).to_have_text(receiver.url)
    delivery = WebhookDelivery.objects.get()
    tasks.deliver(delivery.pk)
    page.reload()
    expect(page.locator("[data-delivery]")).to_contain_text("HTTP 500")
    expect(page.locator("[data-delivery] [data-status]")).to_have_text("pending")
    WebhookDelivery.objects.filter(pk=delivery.pk).update(next_attempt_at=delivery.created_at)
    tasks.deliver(delivery.pk)
    page.reload()
    expect(page.locator("[data-delivery] [data-status]")).to_have_text("delivered")
    page.screenshot(path=str(shots / "webhook.png"), full_page=True)

    page.set_viewport_size({"width": 375, "height": 800})
    for url in (f"{live_server.url}/webhooks/", page.url):
        page.goto(url)
        assert_fits_the_screen(page)
    page.screenshot(path=str(shots / "webhook-phone.png"), full_page=True)
