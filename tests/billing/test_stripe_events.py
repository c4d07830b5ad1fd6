"""Money in from Stripe as Stripe really sends it: the fake Stripe (tests/stripe_fake.py) makes
the objects and sends the events Stripe sends for them, signed with the `stripe` package's own
scheme, through the webhook route. One payment credits once; delayed payments credit when they
succeed; refunds and disputes take the credit back; what Veri cannot apply is acknowledged and
shown to operators."""

import json

import pytest
from django.contrib.auth.models import Permission, User

from billing import services
from billing.models import BillingAccount, LedgerEntry, StripeCheckout, StripeDispute, StripeEvent
from tests.billing.test_stripe import deliver, top_up
from tests.stripe_fake import (
    close_dispute,
    dispute,
    event,
    fail_refund,
    foreign_checkout,
    pay,
    refund,
    twin,
)
from veri import services as veri_services

pytestmark = pytest.mark.django_db


def balance(workspace) -> int:
    return services.balance_micros(workspace=workspace)


def entries(workspace, *kinds: str) -> list[tuple[str, int]]:
    """The workspace's ledger as (kind, micro-dollars), oldest first, of the kinds given."""
    rows = LedgerEntry.objects.filter(workspace=workspace, kind__in=kinds).order_by("pk")
    return list(rows.values_list("kind", "amount_micros"))


def paid_top_up(client, api_client, amount_usd: str = "25") -> str:
    """A top-up paid by card and credited: its Checkout Session's id."""
    session = top_up(api_client, amount_usd)
    deliver(client, *pay(session))
    return session


def ledger_kinds(api_client) -> list[tuple[str, str]]:
    return [
        (e["kind"], e["amount_usd"]) for e in api_client.get("/v1/billing/ledger").json()["data"]
    ]


# One payment, one credit


def test_two_event_objects_for_one_checkout_credit_it_once(client, api_client, billed, stripe_api):
    session = top_up(api_client, "25")
    [paid] = pay(session)
    before = balance(billed)
    deliver(client, paid, twin(paid), paid)  # two Event objects, one of them delivered twice
    assert balance(billed) == before + 25_000_000
    assert entries(billed, "top_up") == [("top_up", 25_000_000)]
    # Each event is recorded once, by its id, and says what it did.
    records = StripeEvent.objects.filter(object_id=session).order_by("pk")
    assert [(r.outcome, r.deliveries) for r in records] == [("applied", 2), ("applied", 1)]
    assert "already credited" in records[1].detail


# Delayed payment methods


@pytest.mark.parametrize("order", ["as-sent", "reversed"])
def test_a_delayed_payment_credits_once_when_it_succeeds(
    client, api_client, billed, stripe_api, order
):
    session = top_up(api_client, "40")
    completed, succeeded = pay(session, method="us_bank_account")
    assert json.loads(completed)["data"]["object"]["payment_status"] == "unpaid"
    before = balance(billed)
    first, second = (completed, succeeded) if order == "as-sent" else (succeeded, completed)
    deliver(client, first)
    if order == "as-sent":  # completed, not paid yet: nothing to spend
        assert balance(billed) == before
        assert api_client.get("/v1/billing").json()["balance_usd"] == services.usd(before)
    deliver(client, second, twin(succeeded), twin(completed))
    assert balance(billed) == before + 40_000_000
    assert entries(billed, "top_up") == [("top_up", 40_000_000)]
    assert StripeCheckout.objects.get(session_id=session).status == "paid"


@pytest.mark.parametrize("order", ["as-sent", "reversed"])
def test_a_delayed_payment_that_fails_credits_nothing(
    client, api_client, billed, stripe_api, order
):
    session = top_up(api_client, "40")
    completed, failed = pay(session, method="sepa_debit", outcome="failed")
    before = balance(billed)
    deliver(client, *((completed, failed) if order == "as-sent" else (failed, completed)))
    assert balance(billed) == before
    assert entries(billed, "top_up") == []
    assert StripeCheckout.objects.get(session_id=session).status == "failed"
    [record] = StripeEvent.objects.filter(type="checkout.session.async_payment_failed")
    assert (record.outcome, "failed" in record.detail) == ("ignored", True)


def test_a_payment_in_the_customers_own_currency_credits_the_usd_amount(
    client, api_client, billed, stripe_api
):
    """Adaptive Pricing: the customer saw and paid EUR; the session is still in USD."""
    session = top_up(api_client, "25")
    before = balance(billed)
    deliver(client, *pay(session, presentment=("eur", 2310)))
    assert balance(billed) == before + 25_000_000


# Refunds and disputes take the credit back


def test_a_refund_takes_the_top_up_back_once(client, api_client, billed, stripe_api):
    session = paid_top_up(client, api_client, "25")
    before = balance(billed)
    charge_refunded, refund_created = refund(session)
    deliver(client, charge_refunded, refund_created, twin(charge_refunded), refund_created)
    assert balance(billed) == before - 25_000_000
    assert entries(billed, "top_up_refunded") == [("top_up_refunded", -25_000_000)]
    assert ledger_kinds(api_client)[0] == ("top_up_refunded", "-25.00")


def test_partial_refunds_each_take_their_part(client, api_client, billed, stripe_api):
    session = paid_top_up(client, api_client, "25")
    before = balance(billed)
    first = refund(session, 1000)
    deliver(client, *first)
    second = refund(session, 500)
    # Each charge.refunded lists every refund of the charge so far: none is taken twice.
    deliver(client, *reversed(second), *first)
    assert balance(billed) == before - 15_000_000
    assert entries(billed, "top_up_refunded") == [
        ("top_up_refunded", -10_000_000),
        ("top_up_refunded", -5_000_000),
    ]


def test_a_refund_that_fails_gives_the_credit_back(client, api_client, billed, stripe_api):
    session = paid_top_up(client, api_client, "25")
    before = balance(billed)
    made = refund(session)
    deliver(client, *made)
    assert balance(billed) == before - 25_000_000
    deliver(client, *fail_refund(json.loads(made[1])["data"]["object"]["id"]))
    assert balance(billed) == before
    assert entries(billed, "top_up_refunded") == [
        ("top_up_refunded", -25_000_000),
        ("top_up_refunded", 25_000_000),
    ]


def test_a_refund_reported_failed_before_it_was_reported_made_takes_nothing(
    client, api_client, billed, stripe_api
):
    """Stripe does not promise the order of events: the failure may come first."""
    session = paid_top_up(client, api_client, "25")
    before = balance(billed)
    made = refund(session)
    failed = fail_refund(json.loads(made[1])["data"]["object"]["id"])
    deliver(client, *failed, *made)
    assert balance(billed) == before
    assert sum(amount for _, amount in entries(billed, "top_up_refunded")) == 0


def test_an_open_dispute_holds_the_amount_and_a_lost_one_keeps_it(
    client, api_client, billed, stripe_api
):
    session = paid_top_up(client, api_client, "25")
    before = balance(billed)
    dispute_id, [created] = dispute(session)
    deliver(client, created, twin(created))
    assert balance(billed) == before - 25_000_000  # held while open: the balance shows it
    assert ledger_kinds(api_client)[0] == ("dispute_hold", "-25.00")
    held = StripeDispute.objects.get(dispute_id=dispute_id)
    assert (held.outcome, held.stripe_status, held.reason) == (
        "open",
        "needs_response",
        "fraudulent",
    )
    deliver(client, *close_dispute(dispute_id, "lost"))
    assert balance(billed) == before - 25_000_000
    assert entries(billed, "dispute_hold", "dispute_released") == [("dispute_hold", -25_000_000)]
    assert StripeDispute.objects.get(dispute_id=dispute_id).outcome == "lost"


@pytest.mark.parametrize("order", ["as-sent", "closed-first"])
def test_a_won_dispute_gives_the_hold_back(client, api_client, billed, stripe_api, order):
    session = paid_top_up(client, api_client, "25")
    before = balance(billed)
    dispute_id, created = dispute(session)
    closed = close_dispute(dispute_id, "won")
    deliver(client, *(created + closed if order == "as-sent" else closed + created))
    assert balance(billed) == before
    assert entries(billed, "dispute_hold", "dispute_released") == [
        ("dispute_hold", -25_000_000),
        ("dispute_released", 25_000_000),
    ]
    assert StripeDispute.objects.get(dispute_id=dispute_id).outcome == "won"


def test_operators_see_open_disputes_in_the_admin(client, api_client, billed, stripe_api):
    session = paid_top_up(client, api_client, "25")
    dispute_id, created = dispute(session, reason="product_not_received")
    deliver(client, *created)
    operator = User.objects.create_user("ops", is_staff=True)
    operator.user_permissions.set(Permission.objects.filter(codename="view_stripedispute"))
    client.force_login(operator)
    page = client.get("/admin/billing/stripedispute/").content.decode()
    assert dispute_id in page and "product_not_received" in page and "25.00 USD" in page


# What Veri cannot apply: acknowledged (Stripe stops resending), recorded for an operator


def unknown_workspace(billed, client, api_client):
    return foreign_checkout(currency="usd", amount=2500, metadata={"workspace": "ws_nosuch"})


def other_currency(billed, client, api_client):
    return foreign_checkout(currency="eur", amount=2500, metadata={"workspace": billed.public_id})


def amount_out_of_range(billed, client, api_client):
    metadata = {"workspace": billed.public_id}
    return foreign_checkout(currency="usd", amount=5_000_000, metadata=metadata)  # 50,000 USD


def refund_of_an_unknown_payment(billed, client, api_client):
    session = top_up(api_client, "25")
    pay(session)  # paid, but its event never reached Veri: nothing was credited
    return refund(session)


def live_event_with_a_test_key(billed, client, api_client):
    session = top_up(api_client, "25")
    [paid] = pay(session)
    return [event("checkout.session.completed", json.loads(paid)["data"]["object"], livemode=True)]


@pytest.mark.parametrize(
    ("case", "reason"),
    [
        (unknown_workspace, "does not have"),
        (other_currency, "paid in EUR"),
        (amount_out_of_range, "outside the top-up range"),
        (refund_of_an_unknown_payment, "no top-up Veri credited"),
        (live_event_with_a_test_key, "test and live money never mix"),
    ],
    ids=lambda value: getattr(value, "__name__", ""),
)
def test_an_event_veri_cannot_apply_is_acknowledged_and_shown_to_operators(
    client, api_client, billed, stripe_api, admin_client, case, reason
):
    payloads = case(billed, client, api_client)
    written = LedgerEntry.objects.count()
    deliver(client, *payloads)
    assert LedgerEntry.objects.count() == written  # nothing credited or taken
    record = StripeEvent.objects.filter(outcome="unapplied").latest("pk")
    assert reason in record.detail, record.detail
    page = admin_client.get("/admin/billing/stripeevent/").content.decode()
    assert record.event_id in page and reason in page


def test_an_operator_applies_an_event_again_once_its_cause_is_fixed(
    client, api_client, billed, stripe_api, admin_client
):
    newcomer, _ = veri_services.create_workspace(name="newcomer")
    [paid] = foreign_checkout(
        currency="usd", amount=2500, metadata={"workspace": newcomer.public_id}
    )
    deliver(client, paid)
    record = StripeEvent.objects.get()
    assert (record.outcome, "no billing account" in record.detail) == ("unapplied", True)
    services.open_billing_account(workspace=newcomer)
    form = {"action": "apply_again", "_selected_action": [str(record.pk)]}
    admin_client.post("/admin/billing/stripeevent/", form)
    assert balance(newcomer) == 25_000_000
    assert StripeEvent.objects.get().outcome == "applied"
    deliver(client, paid)  # and Stripe resending it changes nothing
    assert balance(newcomer) == 25_000_000


def test_another_deployments_checkout_is_ignored(client, billed, stripe_api):
    metadata = {"workspace": billed.public_id, "veri_deployment": "somewhere-else"}
    before = balance(billed)
    deliver(client, *foreign_checkout(currency="usd", amount=2500, metadata=metadata))
    assert balance(billed) == before
    assert StripeEvent.objects.get().outcome == "ignored"


def test_an_account_without_billing_is_not_credited_by_name_alone(client, stripe_api, db):
    """A workspace with no billing account gets nothing written (an operator decides)."""
    bare, _ = veri_services.create_workspace(name="bare")
    deliver(
        client,
        *foreign_checkout(currency="usd", amount=2500, metadata={"workspace": bare.public_id}),
    )
    assert not BillingAccount.objects.filter(workspace=bare).exists()
    assert balance(bare) == 0
