"""The run pages in a real browser (Debian's Chromium through Playwright) against a live server:
progress and ETA move in the header and the jobs list while a real GRPO job trains on the tiny
model (a real qcluster and local provider); the metrics view's picker adds a chart, smoothing
adds the smoothed line, a drag zooms every chart and Reset zoom undoes it, the legend shows the
latest value, and a metric left out by the configuration says why; ticking two jobs in the list
opens the compare page, which draws both runs in one chart and marks the settings that differ.
The run page and the compare page are saved as screenshots (docs/screenshots with
VERI_SCREENSHOTS_DIR=docs/screenshots)."""

import re

import pytest
from playwright.sync_api import Page, expect

from tests.browser.test_dashboard import (
    EMAIL,
    assert_fits_the_screen,
    number,
    screenshots_dir,
    sign_in,
)
from tests.browser.test_refund_review import browser_page  # noqa: F401 - the Chromium page
from tests.dashboard.conftest import member_of
from tests.e2e.conftest import qcluster  # noqa: F401 - the real cluster
from tests.e2e.test_training import GRPO_ROWS, TINY, platform  # noqa: F401
from tests.e2e.test_training import submit as submit_through_api
from tests.training.conftest import worker_client
from training import tasks
from training.models import TrainingJob
from worker.runner import registration

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True, serialized_rollback=True)]

# A fifth of a second a step in the reward: the job runs long enough to watch it move.
SLOW_REWARD = (
    "import time\n\n"
    "def reward(completions, **kwargs):\n"
    "    time.sleep(0.2)\n"
    "    return [c.count('a') / max(len(c), 1) for c in completions]\n"
)


def w(job: TrainingJob, action: str) -> str:
    return f"/v1/worker/jobs/{job.public_id}/{action}"


def running_job_with_metrics(submit, learning_rate: float, offset: float) -> TrainingJob:
    """A job the worker API reports running, with 30 steps of GRPO-like metrics."""
    job = submit(hyperparameters={"max_steps": 50, "learning_rate": learning_rate})
    tasks.provision_job(job_id=job.pk)
    worker = worker_client(job)
    worker.post(w(job, "register"), registration() | {"hostname": "gpu-1"}, format="json")
    worker.post(w(job, "status"), {"status": "running"}, format="json")
    points = [
        {
            "step": s,
            "values": {
                "loss": 1 / s + offset,
                "reward": s / 30 + offset,
                "learning_rate": learning_rate,
                "grad_norm": 2 - s / 20,
                "completions/mean_length": 10 + s % 7,
            },
        }
        for s in range(1, 31)
    ]
    response = worker.post(w(job, "metrics"), {"points": points}, format="json")
    assert response.status_code == 200, response.content
    return job


def chart_legend(page: Page, key: str) -> list[str]:
    """The labels of a chart's series in its uPlot legend (the x axis first)."""
    return page.locator(f"[data-chart='{key}'] .u-legend .u-series .u-label").all_inner_texts()


def test_the_metrics_view_and_comparing_two_jobs(live_server, browser_page, submit, workspace):  # noqa: F811
    member_of(workspace, EMAIL)
    a = running_job_with_metrics(submit, 1e-5, 0.0)
    b = running_job_with_metrics(submit, 3e-5, 0.5)
    page = browser_page
    page.set_viewport_size({"width": 1280, "height": 900})
    sign_in(page, live_server.url)

    page.goto(f"{live_server.url}/jobs/{a.public_id}/#metrics")
    page.wait_for_function(
        "() => Number(document.querySelector('[data-chart=loss]')?.dataset.points) === 30"
    )
    # The legend shows the latest value without a hover (not "--").
    legend = page.locator("[data-chart=loss] .u-legend .u-series").nth(1)
    expect(legend.locator(".u-value")).to_have_text("0.03333")  # 1/30
    # KL is not reported with kl_coef 0: its chart says why instead of being left out.
    expect(page.locator("[data-chart=kl] [data-note]")).to_contain_text("kl_coef is 0")
    # The picker lists every reported metric; ticking one adds its chart.
    charts = page.locator("[data-charts] > figure").count()
    page.click("[data-picker] summary")
    page.fill("[data-metric-search]", "mean_len")
    expect(page.locator("[data-metric-list] li:visible")).to_have_count(1)
    page.check("[data-metric-list] input[value='completions/mean_length']")
    expect(page.locator("[data-chart='completions/mean_length'] canvas")).to_be_visible()
    assert page.locator("[data-charts] > figure").count() == charts + 1
    page.click("[data-picker] summary")
    # Smoothing draws the smoothed line over the faint raw one.
    page.locator("[data-smoothing]").fill("0.8")
    expect(page.locator("[data-smoothing-value]")).to_have_text("0.80")
    assert chart_legend(page, "reward") == ["step", "raw", "reward"]
    # Dragging across a chart zooms every chart; Reset zoom shows all steps again.
    box = page.locator("[data-chart=reward] .u-over").bounding_box()
    page.mouse.move(box["x"] + box["width"] * 0.2, box["y"] + 50)
    page.mouse.down()
    page.mouse.move(box["x"] + box["width"] * 0.5, box["y"] + 50, steps=5)
    page.mouse.up()
    expect(page.locator("[data-metrics-view]")).to_have_attribute("data-zoomed", "true")
    # Every chart shows the same steps, about the fifth to the half of them.
    zoomed = page.locator("[data-chart=loss]")
    assert (
        3
        < float(zoomed.get_attribute("data-x-min"))
        < float(zoomed.get_attribute("data-x-max"))
        < 20
    )
    page.click("[data-reset-zoom]")
    expect(page.locator("[data-metrics-view]")).not_to_have_attribute("data-zoomed", "true")
    expect(zoomed).to_have_attribute("data-x-min", "1")
    expect(zoomed).to_have_attribute("data-x-max", "30")
    page.locator("[data-smoothing]").fill("0")
    # Time on the x axis.
    page.select_option("[data-x-axis]", "relative")
    assert chart_legend(page, "reward")[0] == "time since start"
    page.select_option("[data-x-axis]", "step")

    # Compare: tick both jobs in the list.
    page.goto(f"{live_server.url}/jobs/")
    expect(page.locator("[data-compare-button]")).to_be_disabled()
    page.check(f"[data-compare-pick][value={a.public_id}]")
    page.check(f"[data-compare-pick][value={b.public_id}]")
    page.click("[data-compare-button]")
    page.wait_for_url(re.compile(r"/jobs/compare/\?"))
    page.wait_for_function(
        "() => Number(document.querySelector('[data-chart=reward]')?.dataset.points) === 60"
    )
    # One chart, both runs: a series each, labelled with its job id.
    legend = chart_legend(page, "reward")  # the runs in the list's order, newest first
    assert legend[0] == "step" and sorted(legend[1:]) == sorted([a.public_id, b.public_id])
    assert number(page, "[data-chart=loss]", "data-points") == 60
    differs = page.locator("[data-config-diff] tr.differs th")
    expect(differs.filter(has_text="hyperparameters.learning_rate")).to_have_count(1)
    expect(differs.filter(has_text="hyperparameters.max_steps")).to_have_count(0)
    page.check("[data-only-differences]")
    expect(page.locator("[data-config-diff] tbody tr:visible")).to_have_count(differs.count())

    # A phone: the compare page, a run's metrics and the list are no wider than the screen.
    page.set_viewport_size({"width": 375, "height": 812})
    for url in (page.url, f"/jobs/{a.public_id}/#metrics", "/jobs/"):
        page.goto(url if url.startswith("http") else live_server.url + url)
        page.wait_for_load_state("networkidle")
        assert_fits_the_screen(page)


def progress_of(page: Page, scope: str) -> tuple[int, float | None]:
    """(step, ETA seconds) as the progress block under `scope` shows them."""
    box = page.locator(f"{scope} [data-progress]")
    eta = box.get_attribute("data-eta")
    return int(box.get_attribute("data-step") or 0), float(eta) if eta else None


def test_progress_and_eta_move_while_real_jobs_train(
    api_client,
    platform,  # noqa: F811
    workspace,
    live_server,
    browser_page,  # noqa: F811
    tmp_path,
):
    platform(VERI_LOCAL_SLOTS="2")
    member_of(workspace, EMAIL)
    # Far more steps than the test watches: a job that ends while the header is read has no ETA
    # left to move (the test cancels both at the end).
    hyperparameters = {
        "max_steps": 400,
        "batch_size": 8,
        "rollouts_per_prompt": 4,
        "max_response_length": 16,
        "kl_coef": 0.0,
    }
    jobs = [
        submit_through_api(
            api_client,
            GRPO_ROWS,
            base_model=TINY,
            method="grpo",
            reward_source=SLOW_REWARD,
            output_name=f"lr-{rate}",
            hyperparameters=hyperparameters | {"learning_rate": rate},
        )
        for rate in (1e-2, 2e-3)
    ]
    page, shots = browser_page, screenshots_dir(tmp_path)
    page.set_viewport_size({"width": 1280, "height": 900})
    sign_in(page, live_server.url)

    # The jobs list follows the first job's steps without a reload.
    row = f"tr:has([data-compare-pick][value={jobs[0]}])"
    page.wait_for_function(
        f"() => Number(document.querySelector('{row} [data-progress]').dataset.step) > 0",
        timeout=300_000,
    )
    step, _ = progress_of(page, row)
    page.wait_for_function(
        f"() => Number(document.querySelector('{row} [data-progress]').dataset.step) > {step}",
        timeout=60_000,
    )
    expect(page.locator(f"{row} [data-progress-step]")).to_contain_text(" / 400")

    # The job's header: step of total, a bar, elapsed, an ETA that moves, the cost so far.
    page.goto(f"{live_server.url}/jobs/{jobs[0]}/")
    header = ".job > [data-progress]"
    page.wait_for_function(
        f"() => document.querySelector('{header}').dataset.eta !== ''", timeout=60_000
    )
    step, eta = progress_of(page, ".job >")
    expect(page.locator(f"{header} [data-progress-eta]")).to_have_text(
        re.compile(r"^\d+(s|m \d\ds)$")
    )
    page.wait_for_function(
        f"() => Number(document.querySelector('{header}').dataset.step) > {step}", timeout=60_000
    )
    page.wait_for_function(
        f"() => (e => e !== '' && Number(e) !== {eta})"
        f"(document.querySelector('{header}').dataset.eta)",
        timeout=60_000,
    )
    later, later_eta = progress_of(page, ".job >")
    assert later > step and later_eta is not None and later_eta != eta
    assert float(page.get_attribute(f"{header} [data-progress-bar]", "value")) > 0
    expect(page.locator(f"{header} [data-progress-cost]")).to_contain_text("USD so far")
    expect(page.locator(f"{header} [data-progress-elapsed]")).to_have_text(re.compile(r"\d"))

    # The run page's metrics, for the docs.
    page.click("[data-tab=metrics]")
    page.wait_for_function(
        "() => Number(document.querySelector('[data-chart=reward]')?.dataset.points) >= 15",
        timeout=240_000,
    )
    expect(page.locator("[data-chart=kl] [data-note]")).to_contain_text("kl_coef is 0")
    page.screenshot(path=str(shots / "run-page.png"), full_page=True)

    # Both runs in one chart.
    page.goto(f"{live_server.url}/jobs/compare/?ids={jobs[0]},{jobs[1]}")
    page.wait_for_function(
        "() => Number(document.querySelector('[data-chart=reward]')?.dataset.points) >= 30",
        timeout=120_000,
    )
    assert chart_legend(page, "reward") == ["step", *jobs]
    page.check("[data-only-differences]")
    page.screenshot(path=str(shots / "compare.png"), full_page=True)
    for job_id in jobs:
        api_client.post(f"/v1/training_jobs/{job_id}/cancel")
