"""The customers' dashboard in a real browser (Debian's Chromium through Playwright) against a live
server, a real qcluster and the local provider training a real GRPO job on the tiny model: the
Logs tab grows and the Metrics charts gain points without a reload, the Samples tab lists
completions with each reward function's score, a failed job tells its owner why, another
workspace's pages are 404, and the pages fit a 375 px phone."""

import os
import re
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect
from playwright.sync_api import TimeoutError as PlaywrightTimeout

from billing.services import open_billing_account
from tests.billing.test_ledger import failed_after_an_hour
from tests.browser.test_refund_review import browser_page  # noqa: F401 - the Chromium page
from tests.conftest import fill_volume
from tests.dashboard.conftest import PASSWORD, member_of
from tests.e2e.conftest import qcluster  # noqa: F401 - the real cluster
from tests.e2e.test_training import GRPO_ROWS, TINY, platform  # noqa: F401
from tests.e2e.test_training import submit as submit_through_api
from training.models import TrainingJob
from veri import services
from veri.models import Workspace
from volumes.models import Volume
from volumes.services import create_volume

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True, serialized_rollback=True)]

# Two reward functions, each taking a fifth of a second a step: the job runs for half a minute,
# long enough to watch it live, however fast the machine trains.
TWO_REWARDS = (
    "import time\n\n"
    "from veri_sdk import reward_function\n\n"
    "@reward_function\n"
    "def share_of_a(completions, **kwargs):\n"
    "    time.sleep(0.2)\n"
    "    return [c.count('a') / max(len(c), 1) for c in completions]\n\n"
    "@reward_function\n"
    "def short(completions, **kwargs):\n"
    "    time.sleep(0.2)\n"
    "    return [1.0 if len(c) < 40 else 0.0 for c in completions]\n"
)
EMAIL = "owner@acme.test"


def screenshots_dir(tmp_path: Path) -> Path:
    """Under the test's own folder; VERI_SCREENSHOTS_DIR (e.g. docs/screenshots) keeps them."""
    folder = Path(os.environ.get("VERI_SCREENSHOTS_DIR") or tmp_path / "screenshots")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def sign_in(page: Page, base: str) -> None:
    page.goto(f"{base}/")
    page.fill("#id_username", EMAIL)
    page.fill("#id_password", PASSWORD)
    page.click("button:has-text('Sign in')")
    expect(page.locator("h1")).to_have_text("Training jobs")


def number(page: Page, selector: str, attribute: str) -> int:
    return int(page.get_attribute(selector, attribute) or 0)


def assert_fits_the_screen(page: Page) -> None:
    overflow = page.evaluate(
        "document.documentElement.scrollWidth - document.documentElement.clientWidth"
    )
    assert overflow <= 0, f"{page.url} is {overflow}px wider than the screen"


def test_a_running_grpo_job_updates_live_in_every_tab(
    api_client,
    platform,  # noqa: F811
    workspace,
    live_server,
    browser_page,  # noqa: F811
    tmp_path,
):
    platform()
    member_of(workspace, EMAIL)
    job_id = submit_through_api(
        api_client,
        GRPO_ROWS,
        base_model=TINY,
        method="grpo",
        reward_source=TWO_REWARDS,
        checkpoint_every=10,
        hyperparameters={
            "learning_rate": 1e-2,
            "max_steps": 60,
            "batch_size": 8,
            "rollouts_per_prompt": 4,
            "max_response_length": 16,
            "kl_coef": 0.0,
        },
    )
    page, shots = browser_page, screenshots_dir(tmp_path)
    page.set_viewport_size({"width": 1280, "height": 900})
    sign_in(page, live_server.url)
    page.click(f"a[href='/jobs/{job_id}/']")
    expect(page.locator("[data-panel=overview]")).to_be_visible()

    # Logs: lines arrive while the job runs, with no reload.
    page.click("[data-tab=logs]")
    log = "[data-log]"
    try:
        page.wait_for_function(
            "() => document.querySelector('[data-log]').textContent.includes('step ')",
            timeout=180_000,
        )
    except PlaywrightTimeout:
        job = TrainingJob.objects.get(public_id=job_id)
        shown = page.inner_text("[data-log]")[-2000:]
        raise AssertionError(f"no step line: {job.status} {job.error_message}\n{shown}") from None
    seen = number(page, log, "data-lines")
    page.wait_for_function(
        f"() => Number(document.querySelector('[data-log]').dataset.lines) > {seen}", timeout=30_000
    )
    # A reader who scrolled up keeps their place while lines are added; at the bottom, they follow.
    # (Enough lines to scroll can take a minute: a step takes seconds on a busy machine.)
    page.wait_for_function(
        "() => (l => l.scrollHeight > l.clientHeight + 100)(document.querySelector('[data-log]'))",
        timeout=120_000,
    )
    page.evaluate("document.querySelector('[data-log]').scrollTop = 0")
    grown = number(page, log, "data-lines")
    page.wait_for_function(
        f"() => Number(document.querySelector('[data-log]').dataset.lines) > {grown}",
        timeout=30_000,
    )
    assert page.evaluate("document.querySelector('[data-log]').scrollTop") == 0
    page.evaluate("const l = document.querySelector('[data-log]'); l.scrollTop = l.scrollHeight")
    grown = number(page, log, "data-lines")
    page.wait_for_function(
        f"() => Number(document.querySelector('[data-log]').dataset.lines) > {grown}",
        timeout=30_000,
    )
    assert (
        page.evaluate(
            "(l => l.scrollHeight - l.scrollTop - l.clientHeight)"
            "(document.querySelector('[data-log]'))"
        )
        < 8
    )
    # Searching shows only matching lines, marked.
    page.fill("[data-log-search]", "worker for")
    expect(page.locator("[data-log-matches]")).to_have_text("1 matching line")
    expect(page.locator("[data-log] mark")).to_have_text("worker for")
    page.fill("[data-log-search]", "")

    # Metrics: charts gain points without a reload.
    page.click("[data-tab=metrics]")
    chart = "[data-chart=reward]"
    page.wait_for_function(
        "() => Number(document.querySelector('[data-chart=reward]').dataset.points) > 0"
    )
    points = number(page, chart, "data-points")
    page.wait_for_function(
        f"() => Number(document.querySelector('[data-chart=reward]').dataset.points) > {points}",
        timeout=60_000,
    )
    expect(page.locator("[data-chart=loss] canvas")).to_be_visible()

    # Samples: a prompt's rollouts, opened, with each reward function's score; a chart per
    # function.
    page.click("[data-tab=samples]")
    group = page.locator("[data-samples] tbody[data-group]").first
    expect(group).to_contain_text("Tell me about", timeout=60_000)
    # One step's prompts: newer steps arriving meanwhile do not move the row opened.
    step = group.get_attribute("data-step")
    page.select_option("[data-sample-step]", step)
    other_steps = page.locator(f"[data-samples] tbody[data-group]:not([data-step='{step}'])")
    expect(other_steps).to_have_count(0)
    group.locator("tr.group").click()
    expect(group.locator("[data-rollout]").first).to_be_visible()
    expect(group.locator("[data-rollout]").first).to_contain_text("share_of_a")
    expect(group.locator("[data-rollout]").first).to_contain_text("short")
    page.wait_for_function(
        "() => Number(document.querySelector('[data-reward-functions]').dataset.points) > 0"
    )
    legend = page.locator("[data-reward-functions] .u-legend")
    expect(legend).to_contain_text("share_of_a")
    expect(legend).to_contain_text("short")
    expect(legend).not_to_contain_text("--")  # the newest values until the cursor is over it

    # The job ends; the page says so without a reload and the checkpoints can be fetched.
    expect(page.locator(".actions [data-status]")).to_have_text("completed", timeout=240_000)
    expect(page.locator("[data-live]")).to_have_text("finished", timeout=10_000)
    expect(page.locator("[data-checkpoint-count]")).not_to_have_text("0")
    expect(page.locator("[data-cost]")).to_contain_text("USD", timeout=30_000)
    page.click("[data-tab=logs]")
    page.screenshot(path=str(shots / "logs-tab.png"), full_page=True)
    page.click("[data-tab=metrics]")
    page.screenshot(path=str(shots / "metrics-tab.png"), full_page=True)
    page.goto(f"{live_server.url}/jobs/")
    page.screenshot(path=str(shots / "jobs-list.png"), full_page=True)
    page.goto(f"{live_server.url}/jobs/{job_id}/")
    # The start-up bar: a segment per phase reached, in order, with its seconds.
    segments = page.locator("[data-timings] [data-timing-segment]")
    expect(segments).to_have_count(6)
    assert [segments.nth(i).get_attribute("data-timing-segment") for i in range(6)] == [
        "launched",
        "registered",
        "volumes_synced",
        "model_loaded",
        "first_step",
        "first_checkpoint",
    ]
    assert sum(float(segments.nth(i).get_attribute("width")) for i in range(6)) >= 99
    expect(page.locator("[data-timing=first_step]")).to_contain_text(" s")
    expect(page.locator("[data-timings-total]")).to_contain_text(" s")
    page.click("[data-tab=checkpoints]")
    expect(page.locator("#checkpoints")).to_contain_text("final model")
    link = page.locator("#checkpoints a[download]", has_text="adapter_config.json").first
    download = page.request.get(live_server.url + link.get_attribute("href"))
    assert download.ok and b"base_model_name_or_path" in download.body()
    # Resume from the earliest kept checkpoint: the new job's page; cancelled from there.
    page.locator("#checkpoints button", has_text="Resume from here").last.click()
    page.wait_for_url(re.compile(r"/jobs/job_\w+/$"))
    resumed = TrainingJob.objects.get(resume_from__job__public_id=job_id)
    assert page.url.endswith(f"/jobs/{resumed.public_id}/")
    page.once("dialog", lambda dialog: dialog.accept())
    page.click("button:has-text('Cancel job')")
    expect(page.locator(".actions [data-status]")).to_have_text("cancelled")

    # A phone: nothing is wider than the screen.
    page.set_viewport_size({"width": 375, "height": 812})
    phone_pages = {
        "billing": "/billing/",
        "job-samples": f"/jobs/{job_id}/#samples",
        "job-checkpoints": f"/jobs/{job_id}/#checkpoints",
        "job-logs": f"/jobs/{job_id}/#logs",
        "volume": f"/volumes/{Volume.objects.get(workspace=workspace, name='models').public_id}/",
        "jobs": "/jobs/",
    }
    for name, url in phone_pages.items():
        page.goto(live_server.url + url)
        page.wait_for_load_state("networkidle")
        assert_fits_the_screen(page)
        page.screenshot(path=str(shots / f"phone-{name}.png"), full_page=True)
    assert (shots / "logs-tab.png").stat().st_size > 10_000
    assert (shots / "phone-jobs.png").exists()


def test_failed_job_volume_delete_and_another_workspaces_pages(
    live_server,
    browser_page,  # noqa: F811
    submit,
    workspace,
    billed,
    tmp_path,
):
    """No training here: a job that failed through the platform's fault, settled by the real
    tasks, and objects of a second workspace."""
    member_of(workspace, EMAIL)
    failed = failed_after_an_hour(submit, "provider_reclaimed")
    volume = fill_volume(workspace, "corpus", {"notes.txt": b"n" * 3072})
    other, _ = services.create_workspace(name="other")
    open_billing_account(workspace=other, credit_micros=1)
    theirs, _ = create_volume(workspace=other, name="theirs")
    page = browser_page
    page.set_viewport_size({"width": 375, "height": 812})
    sign_in(page, live_server.url)

    page.goto(f"{live_server.url}/jobs/{failed.public_id}/")
    error = page.locator("[data-error]")
    expect(error).to_contain_text("provider_reclaimed")
    expect(error.locator("[data-attribution]")).to_have_text("platform")
    expect(error.locator("[data-advice] code")).to_have_text(
        ["resume_from", "veri jobs resume <id>"]
    )
    expect(error.locator("[data-refund]")).to_contain_text("credited")
    assert_fits_the_screen(page)
    page.screenshot(path=str(screenshots_dir(tmp_path) / "failed-job-phone.png"), full_page=True)

    page.goto(f"{live_server.url}/volumes/{volume.public_id}/")
    # The one snapshot (written when the upload completed) is the legend's until hovered.
    expect(page.locator("[data-usage-chart] .u-legend")).to_contain_text("3.0 KiB")
    assert_fits_the_screen(page)
    page.fill("#id_confirm", "Corpus")
    page.click("button:has-text('Delete this volume')")
    expect(page.locator(".field-error")).to_contain_text("nothing was deleted")
    page.fill("#id_confirm", "corpus")
    page.click("button:has-text('Delete this volume')")
    expect(page.locator(".flash")).to_contain_text("Deleted volume corpus")
    expect(page.locator("main")).not_to_contain_text(volume.public_id)

    for url in (f"/volumes/{theirs.public_id}/", "/volumes/theirs/"):
        assert page.goto(live_server.url + url).status == 404
    assert Workspace.objects.count() == 2

    # A page left open after the session ends says so, instead of silently going stale.
    queued = submit()
    page.goto(f"{live_server.url}/jobs/{queued.public_id}/")
    expect(page.locator(".actions [data-status]")).to_have_text("queued")
    page.context.clear_cookies()
    expect(page.locator("[data-signed-out]")).to_contain_text("signed out", timeout=10_000)
