"""The playground in Chromium against a live server, a real qcluster and the local provider: a
real fine-tune of the tiny model, deployed with its job page's Deploy button, and its base chat
side by side; both panes stream (their text grows chunk by chunk) and each ends with exactly what
the API answers for its model at temperature 0. Scaled to zero, the deployment says "starting…"
and then answers; a model not deployed is said so in its pane; the pages fit a phone; Delete
asks, then stops the serving process. Writes deployment.png and playground.png
(VERI_SCREENSHOTS_DIR keeps them: docs/screenshots)."""

from datetime import timedelta

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from providers.local import LocalProvider
from serving.models import Deployment
from serving.services import replicas
from tests.browser.test_dashboard import EMAIL, assert_fits_the_screen, screenshots_dir, sign_in
from tests.browser.test_refund_review import browser_page  # noqa: F401 - the Chromium page
from tests.dashboard.conftest import member_of
from tests.e2e.conftest import qcluster  # noqa: F401 - the real cluster
from tests.e2e.test_serving import ask, fine_tune_job, wait_deployment
from tests.e2e.test_training import TINY, platform  # noqa: F401 - a fixture
from tests.openai_api.conftest import openai_client

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True, serialized_rollback=True)]

TOKENS = 32
PANES = ("model", "baseline")
# Each pane's answer text every time it changes: the test reads whether it grew in steps.
WATCH = """() => {
  window.seen = {model: [], baseline: []};
  for (const pane of Object.keys(window.seen)) {
    const box = document.querySelector(`[data-pane=${pane}] [data-conversation]`);
    new MutationObserver(() => {
      const answers = box.querySelectorAll("[data-role=assistant]");
      const last = answers[answers.length - 1];
      const text = last ? last.textContent : "";
      const seen = window.seen[pane];
      if (text && seen[seen.length - 1] !== text) seen.push(text);
    }).observe(box, {childList: true, subtree: true, characterData: true});
  }
}"""


@pytest.fixture
def replicas_stopped():
    """No serving process outlives the test (it would heartbeat to a server going away)."""
    yield
    for deployment in Deployment.objects.all():
        replicas.stop_replicas(deployment=deployment, reason="deleted")


def answer(page, pane: str):
    return page.locator(f"[data-pane={pane}] [data-role=assistant]").last


def send(page, message: str) -> None:
    page.fill("#pg-message", message)
    page.click("[data-send]")


def test_the_playground_streams_a_fine_tune_and_its_base_side_by_side(
    platform,  # noqa: F811
    live_server,
    api_client,
    workspace,
    browser_page,  # noqa: F811
    tmp_path,
    settings,
    replicas_stopped,
):
    platform()
    member_of(workspace, EMAIL)
    client = openai_client(live_server, api_client.raw_key)
    job = fine_tune_job(client)
    model = job.fine_tuned_model
    page = browser_page
    page.set_viewport_size({"width": 1280, "height": 900})
    sign_in(page, live_server.url)

    # Deployed from its job's page: its `ft:` name, on the base it was trained on.
    page.goto(f"{live_server.url}/jobs/{job.model_extra['veri_job_id']}/")
    page.click("[data-deploy] button")
    expect(page.locator("h1")).to_contain_text("dep_")
    deployment = Deployment.objects.get(workspace=workspace)
    assert page.url.endswith(f"/deployments/{deployment.public_id}/")
    assert [a["name"] for a in deployment.adapters] == [model]
    wait_deployment(api_client, deployment.public_id, "ready")
    expected = {
        pane: ask(client, name, max_tokens=TOKENS).choices[0].message.content
        for pane, name in zip(PANES, (model, TINY), strict=True)
    }
    assert expected["model"] != expected["baseline"]  # the adapter changes the greedy answer
    # Its page follows it to ready without a reload.
    expect(page.locator("[data-status]").first).to_have_text("ready")
    page.screenshot(path=str(screenshots_dir(tmp_path) / "deployment.png"), full_page=True)

    # Both panes stream at once, each its own model, and end where the API does.
    page.click("[data-open-playground]")
    expect(page.locator("[data-pane=model] [data-pane-model]")).to_have_value(model)
    expect(page.locator("[data-pane=baseline] [data-pane-model]")).to_have_value(TINY)
    page.fill("#pg-temperature", "0")
    page.fill("#pg-max-tokens", str(TOKENS))
    page.evaluate(WATCH)
    send(page, "Name a fruit.")
    for pane in PANES:
        expect(answer(page, pane)).to_have_attribute("data-done", "", timeout=120_000)
        expect(answer(page, pane)).to_have_text(expected[pane])
    seen = page.evaluate("window.seen")
    for pane in PANES:
        steps = seen[pane]
        assert len(steps) > 1, f"{pane} arrived in one piece: {steps}"
        assert all(b.startswith(a) for a, b in zip(steps, steps[1:], strict=False)), steps
        assert steps[-1] == expected[pane]
    page.screenshot(path=str(screenshots_dir(tmp_path) / "playground.png"), full_page=True)

    # Scaled to zero: the next message, in a new chat, wakes it; each pane says "starting…",
    # then answers.
    replicas.scale_idle(now=timezone.now() + timedelta(hours=1))
    assert Deployment.objects.get(pk=deployment.pk).status == "stopped"
    settings.VERI_SERVING_WAIT_SECONDS = 0  # the router answers model_starting at once
    page.click("[data-new-chat]")
    send(page, "Name a fruit.")
    expect(page.locator("[data-pane=model] [data-pane-status]")).to_have_text("starting…")
    for pane in PANES:
        expect(answer(page, pane)).to_have_attribute("data-done", "", timeout=240_000)
        expect(answer(page, pane)).to_have_text(expected[pane])
    assert not page.locator("[data-error]").count()

    # A model this workspace does not serve: said so in its pane; the other pane answers, its
    # conversation going on.
    page.fill("[data-pane=baseline] [data-pane-model]", "ft:not-deployed")
    page.dispatch_event("[data-pane=baseline] [data-pane-model]", "change")
    send(page, "And another?")
    expect(answer(page, "baseline")).to_have_attribute("data-error", "")
    expect(answer(page, "baseline")).to_contain_text("not deployed in this workspace")
    expect(answer(page, "model")).to_have_attribute("data-done", "", timeout=120_000)
    assert page.locator("[data-pane=model] [data-role=user]").count() == 2

    # The pages fit a phone.
    page.set_viewport_size({"width": 375, "height": 800})
    for path in ("/deployments/", f"/deployments/{deployment.public_id}/", "/playground/"):
        page.goto(f"{live_server.url}{path}")
        assert_fits_the_screen(page)

    # Deleted from its page, after a confirmation: its serving process is gone.
    [replica] = deployment.replicas.filter(status="ready")
    page.goto(f"{live_server.url}/deployments/{deployment.public_id}/")
    page.once("dialog", lambda dialog: dialog.accept())
    page.click("text=Delete this deployment")
    expect(page.locator("h1")).to_have_text("Deployments")
    assert not Deployment.objects.filter(pk=deployment.pk).exists()
    assert not LocalProvider().states([replica.external_id])[replica.external_id].alive
