"""The operators' admin at a 1,400 px screen: a job's page with long values (its reward source,
its settings, events with a long detail) and the jobs list fit the screen, nothing cut off."""

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import expect

from tests.browser.test_refund_review import browser_page  # noqa: F401 - the Chromium page
from training.services.events import record_event

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True, serialized_rollback=True)]


def overflow(page) -> int:
    """How many pixels the page is wider than the window (0: it fits)."""
    return page.evaluate("document.documentElement.scrollWidth - window.innerWidth")


def test_the_admin_fits_a_1400_px_screen(live_server, browser_page, billed, submit):  # noqa: F811
    long = "x" * 400
    job = submit(output_name="wide", hyperparameters={"max_steps": 5, "seed": 7})
    record_event(job_id=job.pk, type="alarm_reward_flat", detail={"message": long, "step": 3})
    User.objects.create_superuser("root", password="root-password-1")
    page = browser_page
    page.set_viewport_size({"width": 1400, "height": 900})
    page.goto(f"{live_server.url}/admin/login/?next=/admin/")
    page.fill("#id_username", "root")
    page.fill("#id_password", "root-password-1")
    page.click("input[type=submit]")
    expect(page.locator("#site-name")).to_be_visible()
    page.goto(f"{live_server.url}/admin/training/trainingjob/{job.pk}/change/")
    expect(page.locator("pre.veri-json", has_text=long[:50])).to_be_visible()
    assert overflow(page) <= 0
    page.goto(f"{live_server.url}/admin/training/trainingjob/")
    expect(page.locator("#result_list")).to_contain_text(job.public_id)
    assert overflow(page) <= 0
