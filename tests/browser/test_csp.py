"""The Content-Security-Policy in a real browser (Debian's Chromium through Playwright): the
dashboard's job page updates live (log lines, chart points) and the admin's pages do their work
(sidebar, changelist actions, a read-only changelist, the autocomplete widget) under the
policy, and the browser reports no violation: no `securitypolicyviolation` event and no console
message about the policy. The listener is checked to catch one on purpose at the end."""

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import Page, expect

from tests.browser.test_dashboard import EMAIL, number, sign_in
from tests.browser.test_refund_review import browser_page  # noqa: F401 - the Chromium page
from tests.dashboard.conftest import member_of
from tests.training.conftest import worker_client
from training import tasks
from worker.runner import registration

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

LISTEN = """
window.__violations = [];
document.addEventListener("securitypolicyviolation", (e) => window.__violations.push(
  `${e.violatedDirective} blocked ${e.blockedURI || "inline"} at ${e.sourceFile}:${e.lineNumber}`
));
"""


class Watch:
    """What the browser says about the policy across pages: violation events (per page, read
    before leaving it), console messages, uncaught errors, and each document's policy header."""

    def __init__(self, page: Page):
        self.page, self.console, self.errors, self.policies = page, [], [], {}
        page.add_init_script(LISTEN)
        page.on("console", lambda message: self.console.append(f"{message.type}: {message.text}"))
        page.on("pageerror", lambda error: self.errors.append(str(error)))
        page.on("response", self._response)

    def _response(self, response) -> None:
        if response.request.resource_type == "document":
            self.policies[response.url] = response.headers.get("content-security-policy")

    def assert_clean(self) -> None:
        self.page.wait_for_timeout(300)  # violation events are dispatched asynchronously
        assert self.page.evaluate("window.__violations") == [], self.page.url
        about_policy = [m for m in self.console if "Content Security Policy" in m]
        assert about_policy == [] and self.errors == [], (about_policy, self.errors)
        for url, header in self.policies.items():
            assert header and "script-src 'self'" in header and "style-src 'self'" in header, url


def w(job, action: str) -> str:
    return f"/v1/worker/jobs/{job.public_id}/{action}"


def test_the_dashboards_live_job_page_works_under_the_policy(
    live_server,
    browser_page,  # noqa: F811
    submit,
    workspace,
):
    member_of(workspace, EMAIL)
    job = submit()
    tasks.provision_job(job_id=job.pk)
    worker = worker_client(job)
    worker.post(w(job, "register"), registration() | {"hostname": "gpu-1"}, format="json")
    worker.post(w(job, "status"), {"status": "running"}, format="json")
    lines = [{"seq": i, "text": f"step {i} loss 0.{i}"} for i in range(40)]
    worker.post(w(job, "logs"), {"lines": lines[:20]}, format="json")
    points = [{"step": s, "values": {"loss": 1 / s, "reward": s / 10}} for s in range(1, 9)]
    worker.post(w(job, "metrics"), {"points": points[:4]}, format="json")

    page, watch = browser_page, Watch(browser_page)
    page.set_viewport_size({"width": 1280, "height": 900})
    sign_in(page, live_server.url)
    watch.assert_clean()
    page.goto(f"{live_server.url}/jobs/{job.public_id}/")
    page.click("[data-tab=logs]")
    page.wait_for_function("() => Number(document.querySelector('[data-log]').dataset.lines) >= 20")
    worker.post(w(job, "logs"), {"lines": lines[20:]}, format="json")
    page.wait_for_function(
        "() => Number(document.querySelector('[data-log]').dataset.lines) >= 40", timeout=30_000
    )
    page.fill("[data-log-search]", "step 33")
    expect(page.locator("[data-log-matches]")).to_have_text("1 matching line")

    page.click("[data-tab=metrics]")
    page.wait_for_function(
        "() => Number(document.querySelector('[data-chart=loss]').dataset.points) > 0"
    )
    shown = number(page, "[data-chart=loss]", "data-points")
    worker.post(w(job, "metrics"), {"points": points[4:]}, format="json")
    page.wait_for_function(
        f"() => Number(document.querySelector('[data-chart=loss]').dataset.points) > {shown}",
        timeout=30_000,
    )
    expect(page.locator("[data-chart=loss] canvas")).to_be_visible()
    expect(page.locator("[data-chart=loss] .u-legend")).to_be_visible()  # uPlot's own styles
    watch.assert_clean()
    for url in ("/jobs/", "/volumes/", "/datasets/", "/billing/", "/keys/"):
        page.goto(live_server.url + url)
        page.wait_for_load_state("networkidle")
        watch.assert_clean()

    # The listener does catch a violation: an inline script added to the page is refused.
    page.evaluate(
        "const s = document.createElement('script'); s.textContent = 'window.ran = 1';"
        "document.body.append(s)"
    )
    page.wait_for_function("() => window.__violations.length > 0")
    assert page.evaluate("window.ran") is None


def test_the_admin_works_under_the_policy(live_server, browser_page, billed, submit):  # noqa: F811
    submit()  # a training job for the changelist
    User.objects.create_superuser("root", password="root-password-1")
    page, watch = browser_page, Watch(browser_page)
    page.set_viewport_size({"width": 1280, "height": 900})
    page.goto(f"{live_server.url}/admin/login/?next=/admin/")
    page.fill("#id_username", "root")
    page.fill("#id_password", "root-password-1")
    page.click("input[type=submit]")
    expect(page.locator("#site-name")).to_be_visible()
    watch.assert_clean()

    # A changelist with actions: selecting a row updates the action counter (actions.js).
    page.goto(f"{live_server.url}/admin/training/trainingjob/")
    page.check("#action-toggle")
    expect(page.locator(".action-counter")).to_contain_text("1 of 1 selected")
    # The sidebar toggles (nav_sidebar.js).
    page.click("#toggle-nav-sidebar")
    expect(page.locator("#main")).not_to_have_class("main shifted")
    watch.assert_clean()

    # A read-only changelist (no delete action).
    page.goto(f"{live_server.url}/admin/billing/ledgerentry/")
    expect(page.locator("#result_list")).to_be_visible()
    watch.assert_clean()

    # The autocomplete widget (jQuery + select2, fetching /admin/autocomplete/).
    page.goto(f"{live_server.url}/admin/billing/billingaccount/add/")
    page.click(".select2-selection")
    page.fill(".select2-search__field", "acme")
    expect(page.locator(".select2-results__option")).to_contain_text(["acme"])
    watch.assert_clean()
