"""What Veri asks of Stripe, when Stripe is not as it was: a key of the other mode or of another
account, two databases sharing one Stripe account, a stored 500, Stripe away or refusing, and a
TLS proxy in front of Veri."""

import socket

import pytest
from django.contrib.auth.models import Permission, User

from billing import services, tasks
from billing.models import BillingAccount, StripeMirror
from tests.billing.test_stripe import deliver, top_up, webhook
from tests.conftest import assert_error
from tests.dashboard.conftest import member_of, signed_in
from tests.stripe_fake import FakeStripe, pay, refund
from veri.money import cents_half_up

pytestmark = pytest.mark.django_db


def account_of(workspace) -> BillingAccount:
    return BillingAccount.objects.get(workspace=workspace)


def stripe_balance(customer_id: str) -> int:
    """The customer's balance as the fake Stripe holds it (cents; a credit is negative)."""
    return FakeStripe.objects[customer_id]["balance"]


def mirrored_in_full(workspace) -> bool:
    customer = account_of(workspace).stripe_customer_id
    ledger = cents_half_up(services.balance_micros(workspace=workspace))
    return stripe_balance(customer) == -ledger


def posts(path_end: str) -> list[dict]:
    return [
        r for r in FakeStripe.requests if r["method"] == "POST" and r["path"].endswith(path_end)
    ]


# Test and live never mix


def test_a_key_of_the_other_mode_gets_a_customer_of_its_own(
    client, api_client, billed, stripe_api, settings
):
    deliver(client, *pay(top_up(api_client, "25")))
    assert tasks.mirror_to_stripe() == 2  # the opening credit and the top-up
    test_customer = account_of(billed).stripe_customer_id
    settings.STRIPE_SECRET_KEY = "sk_live_veri"  # the operator goes live
    top_up(api_client, "30")  # not "No such customer": a live customer is made
    live = account_of(billed)
    assert (live.stripe_customer_mode, live.stripe_customer_id != test_customer) == ("live", True)
    assert FakeStripe.objects[live.stripe_customer_id]["livemode"] is True
    # It starts with what the ledger mirrored, and the mirror goes on there.
    assert mirrored_in_full(billed)
    services.add_credit(workspace=billed, amount_micros=3_000_000, reason="", key="test:live")
    assert tasks.mirror_to_stripe() == 1
    assert account_of(billed).stripe_mirror_error == ""
    assert mirrored_in_full(billed)
    assert stripe_balance(test_customer) == -12500  # the test-mode customer is left as it was


def test_a_customer_stripe_does_not_know_is_made_again(api_client, billed, stripe_api):
    """A key of another Stripe account (same mode): Stripe answers "No such customer"."""
    top_up(api_client, "25")
    tasks.mirror_to_stripe()
    old = account_of(billed).stripe_customer_id
    del FakeStripe.objects[old]
    top_up(api_client, "25")
    new = account_of(billed).stripe_customer_id
    assert new != old and mirrored_in_full(billed)
    services.add_credit(workspace=billed, amount_micros=1_000_000, reason="", key="test:after")
    assert tasks.mirror_to_stripe() == 1 and mirrored_in_full(billed)


def test_the_mirror_makes_the_customer_again_instead_of_stalling(billed, stripe_api, settings):
    assert tasks.mirror_to_stripe() == 1
    settings.STRIPE_SECRET_KEY = "sk_live_veri"
    services.add_credit(workspace=billed, amount_micros=2_000_000, reason="", key="test:1")
    assert tasks.mirror_to_stripe() == 1
    assert account_of(billed).stripe_mirror_error == ""
    assert account_of(billed).stripe_customer_mode == "live" and mirrored_in_full(billed)


def test_two_databases_sharing_one_stripe_account_do_not_collide(billed, stripe_api, settings):
    settings.STRIPE_DEPLOYMENT_ID = "staging"
    services.add_credit(workspace=billed, amount_micros=5_000_000, reason="", key="test:1")
    assert tasks.mirror_to_stripe() == 2
    staging_customer = account_of(billed).stripe_customer_id
    # Another database, its rows numbered the same, on the same Stripe account: what it mirrors
    # must reach its own customer, not replay the other database's answers.
    settings.STRIPE_DEPLOYMENT_ID = "production"
    StripeMirror.objects.all().delete()
    BillingAccount.objects.filter(workspace=billed).update(stripe_customer_id="")
    assert tasks.mirror_to_stripe() == 2
    production_customer = account_of(billed).stripe_customer_id
    assert production_customer != staging_customer
    assert stripe_balance(staging_customer) == stripe_balance(production_customer) == -10500


def test_without_a_set_id_each_database_names_itself_once(billed, stripe_api):
    assert tasks.mirror_to_stripe() == 1
    services.add_credit(workspace=billed, amount_micros=1_000_000, reason="", key="test:1")
    assert tasks.mirror_to_stripe() == 1
    first, second = posts("/balance_transactions")
    deployment = first["body"]["metadata[veri_deployment]"][0]
    assert len(deployment) == 12 and second["body"]["metadata[veri_deployment]"] == [deployment]
    assert first["key"].startswith(f"veri-{deployment}-")


# A stored 500


@pytest.mark.parametrize("took_effect", [False, True], ids=["lost", "took-effect"])
def test_a_stored_500_is_looked_up_then_resent_under_a_new_key_once(
    billed, stripe_api, settings, took_effect
):
    assert tasks.mirror_to_stripe() == 1
    services.add_credit(workspace=billed, amount_micros=7_000_000, reason="", key="test:1")
    error = {"error": {"type": "api_error", "message": "An unknown error occurred"}}
    FakeStripe.failures["/balance_transactions"] = [(500, error, took_effect)]
    assert tasks.mirror_to_stripe() == 0
    assert "An unknown error occurred" in account_of(billed).stripe_mirror_error
    # Within Stripe's window the same key would only replay the 500: nothing is sent.
    sent = len(posts("/balance_transactions"))
    assert tasks.mirror_to_stripe() == 0 and len(posts("/balance_transactions")) == sent
    assert "after" in account_of(billed).stripe_mirror_error
    settings.STRIPE_IDEMPOTENCY_WINDOW_SECONDS = 0  # the window has passed
    assert tasks.mirror_to_stripe() == 1
    assert account_of(billed).stripe_mirror_error == ""
    assert mirrored_in_full(billed)  # in effect once, whether or not the 500 took effect
    keys = [r["key"] for r in posts("/balance_transactions")][1:]
    assert len(keys) == (1 if took_effect else 2) and len(set(keys)) == len(keys)
    assert tasks.mirror_to_stripe() == 0


# Every Stripe error is an answer


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_a_top_up_with_stripe_unreachable_is_503_with_retry_after(
    api_client, billed, stripe_api, settings
):
    settings.STRIPE_API_BASE = f"http://127.0.0.1:{closed_port()}"
    answer = api_client.post("/v1/billing/top_ups", {"amount_usd": "25"}, format="json")
    error = assert_error(answer, 503, "payments_unavailable", None)
    assert "Stripe could not be reached" in error["message"]
    assert answer["Retry-After"] == "10"


@pytest.mark.parametrize(
    ("status", "body"),
    [
        (503, {"error": {"type": "api_error", "message": "Service unavailable"}}),
        (429, {"error": {"type": "invalid_request_error", "code": "rate_limit", "message": "x"}}),
    ],
    ids=["503", "429"],
)
def test_a_top_up_stripe_cannot_serve_now_is_503(api_client, billed, stripe_api, status, body):
    FakeStripe.failures["/v1/checkout/sessions"] = [(status, body, False)]
    answer = api_client.post("/v1/billing/top_ups", {"amount_usd": "25"}, format="json")
    assert_error(answer, 503, "payments_unavailable")
    assert answer["Retry-After"]


@pytest.mark.parametrize(
    ("status", "message", "hint"),
    [
        # Stripe's answer to a key it does not take (401): the operator fixes the key.
        (401, "Invalid API Key provided: sk_test_****veri", "STRIPE_SECRET_KEY"),
        # A Checkout Stripe will not make for this account.
        (
            400,
            "In order to use Checkout, you must set an account or business name at "
            "https://dashboard.stripe.com/account.",
            "set an account or business name",
        ),
    ],
    ids=["bad-key", "refused"],
)
def test_a_top_up_stripe_refuses_is_502_saying_what_to_fix(
    api_client, billed, stripe_api, status, message, hint
):
    error = {"error": {"type": "invalid_request_error", "message": message}}  # Stripe's shape
    FakeStripe.failures["/v1/checkout/sessions"] = [(status, error, False)]
    answer = api_client.post("/v1/billing/top_ups", {"amount_usd": "25"}, format="json")
    assert hint in assert_error(answer, 502, "payments_refused", None)["message"]


def test_a_top_up_without_a_billing_account_is_402_not_a_crash(api_client, stripe_api):
    answer = api_client.post("/v1/billing/top_ups", {"amount_usd": "25"}, format="json")
    assert_error(answer, 402, "billing_account_required")
    assert posts("/v1/checkout/sessions") == []


def test_a_webhook_that_needs_stripe_while_it_is_away_is_503_and_writes_nothing(
    client, api_client, billed, stripe_api, settings
):
    session = top_up(api_client, "25")
    deliver(client, *pay(session))
    charge_refunded, _ = refund(session)
    settings.STRIPE_API_BASE = f"http://127.0.0.1:{closed_port()}"
    answer = webhook(client, charge_refunded)
    assert_error(answer, 503, "payments_unavailable")
    assert answer["Retry-After"] == "10"
    assert services.balance_micros(workspace=billed) == 125_000_000  # Stripe resends it later


# Return URLs behind a TLS proxy


def test_checkout_returns_to_the_public_url_not_the_proxys_http(
    api_client, billed, stripe_api, settings
):
    settings.VERI_PUBLIC_URL = "https://veri.example.com"
    # The request reaches Veri over plain HTTP from its TLS proxy.
    top_up(api_client, "25")
    [session] = posts("/v1/checkout/sessions")
    assert session["body"]["success_url"] == ["https://veri.example.com/?top_up=paid"]
    assert session["body"]["cancel_url"] == ["https://veri.example.com/?top_up=cancelled"]


def test_the_dashboards_top_up_returns_to_its_billing_page_on_the_public_url(
    billed, stripe_api, settings
):
    settings.VERI_PUBLIC_URL = "https://veri.example.com/"
    browser = signed_in(member_of(billed, "owner@acme.test"))
    answer = browser.post("/billing/", {"amount_usd": "25"})
    assert answer.status_code == 302 and answer["Location"].startswith("https://checkout.stripe")
    [session] = posts("/v1/checkout/sessions")
    assert session["body"]["success_url"] == ["https://veri.example.com/billing/?top_up=paid"]


def test_the_admin_shows_the_customers_mode(billed, stripe_api, client, api_client):
    top_up(api_client, "25")
    operator = User.objects.create_user("ops", is_staff=True)
    operator.user_permissions.set(Permission.objects.filter(codename="view_billingaccount"))
    client.force_login(operator)
    page = client.get("/admin/billing/billingaccount/").content.decode()
    assert account_of(billed).stripe_customer_id in page and ">test<" in page
