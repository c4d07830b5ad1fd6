"""The operators' refund review queue in a real browser (Debian's Chromium, driven by
Playwright): one refund approved, another denied with a reason, and a staff user without the
billing permission unable to do either."""

import pytest
from django.contrib.auth.models import Permission, User
from playwright.sync_api import APIResponse, Page, expect, sync_playwright

from billing import services
from billing.models import LedgerEntry, Refund
from tests.billing.test_ledger import failed_after_an_hour
from training.models import TrainingJob

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.fixture
def browser_page():
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page()
        page.set_default_timeout(15_000)
        yield page
        browser.close()


def pending_refund(submit, code: str) -> Refund:
    return Refund.objects.get(job=failed_after_an_hour(submit, code))


def staff(username: str, *permissions: str) -> User:
    user = User.objects.create_user(username, password="pw-" + username, is_staff=True)
    user.user_permissions.set(Permission.objects.filter(codename__in=permissions))
    return user


def log_in(page: Page, base: str, user: User) -> None:
    page.goto(f"{base}/admin/login/?next=/admin/billing/refund/")
    page.fill("#id_username", user.username)
    page.fill("#id_password", "pw-" + user.username)
    page.click("input[type=submit]")
    expect(page.locator("#content h1")).to_contain_text("refund")


def run_action(page: Page, refund: Refund, action: str) -> None:
    page.check(f"input[name=_selected_action][value='{refund.pk}']")
    page.select_option("select[name=action]", action)
    page.click("button[name=index]")


def post_action_by_hand(page: Page, base: str, refund: Refund, action: str) -> APIResponse:
    """The changelist's action request made outside the page, with the CSRF token the page
    carries, as a user without the action in their menu could send it."""
    page.goto(f"{base}/admin/billing/refund/")
    token = page.locator("#changelist-form input[name=csrfmiddlewaretoken]").get_attribute("value")
    assert token
    return page.request.post(
        f"{base}/admin/billing/refund/",
        form={"csrfmiddlewaretoken": token, "action": action, "_selected_action": str(refund.pk)},
        headers={"Referer": f"{base}/admin/billing/refund/"},
    )


def test_an_operator_approves_one_refund_and_denies_another(
    browser_page, live_server, submit, billed
):
    approved = pending_refund(submit, "worker_failed")
    denied = pending_refund(submit, "upload_failed")
    operator = staff("operator", "view_refund", "review_refund")
    before = services.balance_micros(workspace=billed)
    page = browser_page
    log_in(page, live_server.url, operator)
    # The queue shows each pending refund with its error code, attribution and amount.
    rows = page.locator("#result_list tbody tr")
    expect(rows).to_have_count(2)
    expect(page.locator("#result_list")).to_contain_text("worker_failed")
    expect(page.locator("#result_list")).to_contain_text("upload_failed")

    run_action(page, approved, "approve")
    expect(page.locator(".messagelist")).to_contain_text("Approved and credited 1 refund")

    run_action(page, denied, "deny")
    expect(page.locator("textarea[name=reason][required]")).to_have_count(1)  # no reason, no deny
    page.fill("textarea[name=reason]", "The files the job uploaded were the customer's own.")
    page.click("input[type=submit][value=Deny]")
    expect(page.locator(".messagelist")).to_contain_text("Denied 1 refund")

    # The evidence is on each refund's page: the error, the attribution, the events.
    page.goto(f"{live_server.url}/admin/billing/refund/{denied.pk}/change/")
    expect(page.locator("#content")).to_contain_text("upload_failed")
    expect(page.locator("#content")).to_contain_text("refund_denied")

    assert Refund.objects.get(pk=approved.pk).status == "credited"
    assert Refund.objects.get(pk=denied.pk).status == "denied"
    assert Refund.objects.get(pk=denied.pk).reviewer == operator
    credited = approved.job.billing.cost_micros
    assert services.balance_micros(workspace=billed) == before + credited
    assert LedgerEntry.objects.filter(kind="refund_credit").count() == 1


def test_staff_without_the_billing_permission_cannot_decide(
    browser_page, live_server, submit, billed
):
    refund = pending_refund(submit, "worker_failed")
    viewer = staff("viewer", "view_refund")
    page = browser_page
    log_in(page, live_server.url, viewer)
    expect(page.locator("#result_list")).to_contain_text("worker_failed")  # read-only: visible
    expect(page.locator("select[name=action]")).to_have_count(0)  # but no actions
    # The action posted by hand, with the page's valid CSRF token, changes nothing either: the
    # admin does not run an action it does not offer this user (a CSRF refusal would be a 403).
    response = post_action_by_hand(page, live_server.url, refund, "approve")
    assert response.status == 200, response.status
    assert Refund.objects.get(pk=refund.pk).status == "pending"
    assert not LedgerEntry.objects.filter(kind="refund_credit").exists()
    # Without even the view permission, the queue is not there at all.
    other = staff("nobody-here")
    page.context.clear_cookies()
    page.goto(f"{live_server.url}/admin/login/?next=/admin/billing/refund/")
    page.fill("#id_username", other.username)
    page.fill("#id_password", "pw-" + other.username)
    page.click("input[type=submit]")
    assert page.goto(f"{live_server.url}/admin/billing/refund/").status == 403
    assert not TrainingJob.objects.filter(refund__status="credited").exists()
    # The same request from an operator approves it: what refused the viewer was the permission.
    page.context.clear_cookies()
    log_in(page, live_server.url, staff("operator", "view_refund", "review_refund"))
    assert post_action_by_hand(page, live_server.url, refund, "approve").status == 200
    assert Refund.objects.get(pk=refund.pk).status == "credited"
