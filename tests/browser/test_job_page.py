"""A job's page in Chromium against a live server, its data sent through the real worker API and
settled by the real tasks: the Samples table pages, filters by step and reward range and sorts by
reward; a job restarted after a platform fault shows the credit for the compute it lost, in the
API, in `veri jobs get` and on the page. Writes samples.png and billing.png (VERI_SCREENSHOTS_DIR
keeps them: docs/screenshots)."""

from datetime import timedelta

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from dashboard.templatetags.dashboard import dollars
from providers.models import Instance
from tests.browser.test_dashboard import EMAIL, screenshots_dir, sign_in
from tests.browser.test_refund_review import browser_page  # noqa: F401 - the Chromium page
from tests.dashboard.conftest import member_of
from tests.dashboard.test_job_page import sampled_job
from tests.training.conftest import drive
from tests.training.test_restarts import machine_lost, running
from tests.training.test_worker_and_jobs_api import upload_checkpoint
from training import tasks
from training.models import Checkpoint, JobAttempt, JobStatus
from veri.money import usd
from veri_sdk.cli import main

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True, serialized_rollback=True)]
GROUPS = "[data-samples] tbody[data-group]"


def test_the_samples_table_pages_filters_by_step_and_reward_and_sorts(
    live_server,
    browser_page,  # noqa: F811
    submit,
    workspace,
    tmp_path,
):
    member_of(workspace, EMAIL)
    job, _ = sampled_job(submit)  # 12 prompts of 4 rollouts over steps 2, 4 and 6
    page = browser_page
    page.set_viewport_size({"width": 1280, "height": 900})
    sign_in(page, live_server.url)
    page.goto(f"{live_server.url}/jobs/{job.public_id}/#samples")

    groups = page.locator(GROUPS)
    expect(groups).to_have_count(10)
    expect(page.locator("[data-page-of]")).to_have_text("Page 1 of 2")
    expect(page.locator("[data-samples-count]")).to_have_text("12 prompts, 48 rollouts")
    expect(groups.first).to_have_attribute("data-step", "6")  # newest first
    page.click("[data-page=next]")
    expect(page.locator("[data-page-of]")).to_have_text("Page 2 of 2")
    expect(groups).to_have_count(2)
    expect(page.locator("[data-page=next]")).to_be_disabled()

    # By step: back to the first page, that step's four prompts only.
    page.select_option("[data-sample-step]", "4")
    expect(groups).to_have_count(4)
    assert set(groups.evaluate_all("bs => bs.map(b => b.dataset.step)")) == {"4"}
    expect(page.locator("[data-samples-pager]")).to_be_hidden()

    # By reward range, on every step: only rollouts within it, in the prompts that have some.
    page.select_option("[data-sample-step]", "")
    page.fill("[data-min-reward]", "0.5")
    page.fill("[data-max-reward]", "0.6")
    expect(page.locator("[data-samples-count]")).to_have_text("3 prompts, 7 rollouts")
    rewards = page.locator("[data-rollout] td.num strong").all_inner_texts()
    assert len(rewards) == 7 and all(0.5 <= float(r) <= 0.6 for r in rewards)

    # Sorted by mean reward, highest first, then lowest first.
    page.fill("[data-min-reward]", "")
    page.fill("[data-max-reward]", "")
    expect(page.locator("[data-samples-count]")).to_have_text("12 prompts, 48 rollouts")
    page.select_option("[data-sample-sort]", "-reward")
    expect(groups.first).to_contain_text("Prompt 3")
    means = [float(m) for m in groups.evaluate_all("bs => bs.map(b => b.dataset.meanReward)")]
    assert means == sorted(means, reverse=True) and groups.first.get_attribute("data-step") == "6"
    page.select_option("[data-sample-sort]", "reward")
    expect(groups.first).to_contain_text("Prompt 0")
    assert groups.first.get_attribute("data-step") == "2"

    # A prompt opens to its four rollouts, each with its reward functions' scores.
    page.select_option("[data-sample-sort]", "-reward")
    expect(groups.first).to_contain_text("Prompt 3")
    first = groups.first
    expect(first.locator("[data-rollout]").first).to_be_hidden()
    first.locator("tr.group").click()
    rollouts = first.locator("[data-rollout]")
    expect(rollouts).to_have_count(4)
    expect(rollouts.first).to_be_visible()
    expect(rollouts.first.locator("[data-component=exact]")).to_contain_text("0.750")
    expect(rollouts.first.locator("[data-component=short]")).to_contain_text("0.500")
    groups.nth(1).locator("tr.group").click()
    page.locator("#samples").screenshot(path=str(screenshots_dir(tmp_path) / "samples.png"))


def test_a_restarted_job_shows_its_credit_in_the_api_the_cli_and_the_page(
    live_server,
    browser_page,  # noqa: F811
    submit,
    cloud,
    api_client,
    workspace,
    monkeypatch,
    capsys,
    tmp_path,
):
    """A machine lost 20 minutes after the run's checkpoint: those 20 minutes are credited."""
    member_of(workspace, EMAIL)
    job, worker = running(submit)
    start = timezone.now() - timedelta(minutes=50)
    Instance.objects.filter(job=job).update(launched_at=start)
    upload_checkpoint(worker, job, 10)
    Checkpoint.objects.filter(job=job).update(created_at=start + timedelta(minutes=30))
    machine_lost(cloud, job)
    tasks.provision_job(job_id=job.pk)
    Instance.objects.filter(job=job).update(launched_at=timezone.now() - timedelta(minutes=40))
    drive(job, JobStatus.CONFIGURING, JobStatus.RUNNING, JobStatus.COMPLETED)
    tasks.settle_job(job_id=job.pk)
    run = JobAttempt.objects.get(job=job)
    lost, kept = usd(run.lost_micros), usd(run.kept_micros)
    assert run.lost_micros > 0

    body = api_client.get(f"/v1/training_jobs/{job.public_id}").json()
    assert body["credited_usd"] == lost
    [restart] = body["restarts"]
    assert (restart["kept_usd"], restart["lost_usd"], restart["credited_usd"]) == (kept, lost, lost)
    credits = [e for e in body["ledger"] if e["reason"] == "lost_compute"]
    assert [(e["amount_usd"], e["attempt"]) for e in credits] == [(lost, 1)]
    assert "worker_failed" in credits[0]["description"]
    [charge] = [e for e in body["ledger"] if e["reason"] == "compute"]
    assert charge["amount_usd"] == "-" + body["cost_usd"]
    net = usd(job.billing.cost_micros - run.lost_micros)
    assert body["net_cost_usd"] == net

    monkeypatch.setenv("VERI_API_URL", live_server.url)
    monkeypatch.setenv("VERI_API_KEY", api_client.raw_key)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    capsys.readouterr()
    assert main(["jobs", "get", job.public_id]) == 0
    shown = " ".join(capsys.readouterr().out.split())  # the table's columns, one space apart
    assert (
        f"run 1 ended by worker_failed: {kept} USD kept, {lost} USD lost, {lost} USD credited"
        in shown
    )
    assert f"credit {lost} USD: {job.public_id} run 1: lost to worker_failed" in shown
    assert f"net cost {net} USD" in shown

    # The dashboard writes every amount with four decimals.
    net_micros = job.billing.cost_micros - run.lost_micros
    lost, kept, net = (dollars(m) for m in (run.lost_micros, run.kept_micros, net_micros))
    page = browser_page
    page.set_viewport_size({"width": 1280, "height": 900})
    sign_in(page, live_server.url)
    page.goto(f"{live_server.url}/jobs/{job.public_id}/")
    expect(page.locator("[data-refund-card]")).to_have_text(f"{lost} USD credited")
    money = page.locator("[data-money]")
    expect(money.locator("[data-credited]")).to_have_text(f"{lost} USD")
    expect(money.locator("[data-net]")).to_have_text(f"{net} USD")
    expect(money.locator("[data-credits]")).to_contain_text("lost to worker_failed, after step 10")
    row = money.locator("[data-runs] tbody tr")
    expect(row).to_contain_text("worker_failed")
    expect(row.locator("td[data-label=Kept]")).to_have_text(f"{kept} USD")
    expect(row.locator("td[data-label=Credited]")).to_have_text(f"{lost} USD")
    expect(page.locator("[data-timeline]")).to_contain_text("job_restarted")
    money.screenshot(path=str(screenshots_dir(tmp_path) / "billing.png"))
