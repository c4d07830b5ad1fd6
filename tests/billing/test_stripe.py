"""Payments at the edge: Stripe top-ups by signed webhook, and the ledger mirrored to the Stripe
customer balance. Stripe itself is faked at the HTTP level, at the address the official `stripe`
package calls, so the gateway runs unpatched."""

import json
import time

import pytest

from billing import services, tasks
from billing.models import BillingAccount, LedgerEntry, StripeMirror
from tests.conftest import assert_error, in_threads, postgres_only
from tests.stripe_fake import foreign_checkout, pay, sign
from veri import services as veri_services
from veri.models import Workspace
from veri.money import cents_half_up

pytestmark = pytest.mark.django_db


def webhook(client, payload: bytes, signature: str | None = "sign"):
    """POST a webhook body as Stripe does; `signature` "sign" signs it with our endpoint secret
    through the `stripe` package's own scheme."""
    signature = sign(payload) if signature == "sign" else signature
    headers = {"HTTP_STRIPE_SIGNATURE": signature} if signature else {}
    return client.generic(
        "POST", "/v1/billing/stripe/webhook", payload, content_type="application/json", **headers
    )


def deliver(client, *payloads: bytes) -> None:
    for payload in payloads:
        answer = webhook(client, payload)
        assert answer.status_code == 200 and answer.json() == {"received": True}, answer.json()


def top_up(api_client, amount_usd: str = "25") -> str:
    """A top-up started through the API: the Checkout Session's id."""
    answer = api_client.post("/v1/billing/top_ups", {"amount_usd": amount_usd}, format="json")
    assert answer.status_code == 201, answer.json()
    return answer.json()["checkout_url"].rsplit("/", 1)[1]


def checkout_completed(workspace_id: str, cents: int) -> bytes:
    """A paid `checkout.session.completed` naming the workspace."""
    [payload] = foreign_checkout(currency="usd", amount=cents, metadata={"workspace": workspace_id})
    return payload


def test_a_top_up_is_a_checkout_url_from_stripe(api_client, billed, stripe_api):
    answer = api_client.post("/v1/billing/top_ups", {"amount_usd": "25"}, format="json")
    assert answer.status_code == 201, answer.json()
    assert answer.json()["checkout_url"].startswith("https://checkout.stripe.test/pay/")
    customers, sessions = stripe_api.requests
    assert customers["path"] == "/v1/customers"
    assert billed.public_id in customers["key"]
    assert sessions["body"]["line_items[0][price_data][unit_amount]"] == ["2500"]
    assert sessions["body"]["metadata[workspace]"] == [billed.public_id]
    # The PaymentIntent carries the workspace too: its refunds and disputes name only it.
    assert sessions["body"]["payment_intent_data[metadata][workspace]"] == [billed.public_id]
    assert billed.billing_account.__class__.objects.get(workspace=billed).stripe_customer_id
    assert_error(
        api_client.post("/v1/billing/top_ups", {"amount_usd": "1"}, format="json"),
        400,
        "invalid_request",
        "amount_usd",
    )


def test_top_ups_are_409_with_payments_off(api_client, billed, settings):
    settings.STRIPE_SECRET_KEY = ""
    answer = api_client.post("/v1/billing/top_ups", {"amount_usd": "25"}, format="json")
    assert_error(answer, 409, "payments_disabled")
    assert api_client.get("/v1/billing").json()["payments_enabled"] is False


def test_the_paid_checkout_webhook_tops_up_once(client, api_client, billed, stripe_api):
    before = services.balance_micros(workspace=billed)
    [paid] = pay(top_up(api_client, "25"))
    for _ in range(2):  # Stripe retries deliveries: a replay writes nothing new
        deliver(client, paid)
    assert services.balance_micros(workspace=billed) == before + 25_000_000
    assert LedgerEntry.objects.filter(kind="top_up").count() == 1
    billing = api_client.get("/v1/billing").json()
    assert billing["balance_usd"] == services.usd(before + 25_000_000)
    ledger = api_client.get("/v1/billing/ledger").json()["data"]
    assert ledger[0]["kind"] == "top_up" and ledger[0]["amount_usd"] == "25.00"


@pytest.mark.parametrize(
    "signature",
    [None, "t=1,v1=deadbeef", "garbage", sign(b"{}"), sign(b"x", secret="whsec_other")],
    ids=["missing", "wrong", "garbage", "other-body", "other-secret"],
)
def test_a_webhook_without_our_signature_is_400_and_writes_nothing(
    client, billed, stripe_api, signature
):
    entries = LedgerEntry.objects.count()
    payload = checkout_completed(billed.public_id, 2500)
    assert_error(webhook(client, payload, signature), 400, "invalid_signature")
    assert LedgerEntry.objects.count() == entries


def test_an_old_signature_is_refused(client, billed, stripe_api):
    payload = checkout_completed(billed.public_id, 2500)
    stale = sign(payload, at=int(time.time()) - 3600)
    assert_error(webhook(client, payload, stale), 400, "invalid_signature")


@pytest.mark.parametrize(
    "body",
    [
        b"[1, 2]",
        b"null",
        b'{"id": "evt_9", "type": "checkout.session.completed"}',
        b'{"id": "evt_9", "type": "checkout.session.completed", "data": {"object": [1]}}',
        b'{"type": "checkout.session.completed", "data": {"object": {"payment_status": "paid",'
        b' "amount_total": 100, "metadata": "x", "client_reference_id": "ws_a"}}}',
        b'{"id": "evt_9", "type": "checkout.session.completed", "data": {"object": {'
        b'"payment_status": "paid", "amount_total": true, "client_reference_id": "ws_a"}}}',
        b'{"id": "evt_9", "type": "checkout.session.completed", "data": {"object": {'
        b'"payment_status": "paid", "amount_total": 4611686018427387904,'
        b' "client_reference_id": "ws_a"}}}',
        b'{"id": "' + b"evt_" + b"x" * 5000 + b'", "type": "checkout.session.completed"}',
    ],
    ids=["list", "null", "no-data", "object-list", "no-id", "bool-amount", "huge", "long-id"],
)
def test_signed_events_of_another_shape_are_ignored_not_a_crash(client, billed, stripe_api, body):
    entries = LedgerEntry.objects.count()
    answer = webhook(client, body)
    assert answer.status_code == 200 and LedgerEntry.objects.count() == entries


def test_a_signed_body_nested_too_deeply_is_refused(client, billed, stripe_api):
    body = b"[" * 100_000 + b"]" * 100_000
    assert_error(webhook(client, body), 400, "invalid_signature")


def test_unknown_event_types_are_acknowledged_and_ignored(client, billed, stripe_api):
    entries = LedgerEntry.objects.count()
    payload = json.dumps(
        {"id": "evt_4", "object": "event", "type": "invoice.paid", "data": {"object": {}}}
    ).encode()
    answer = webhook(client, payload)
    assert answer.status_code == 200 and LedgerEntry.objects.count() == entries


def test_the_ledger_is_mirrored_to_the_stripe_balance_once(billed, stripe_api):
    services.add_credit(
        workspace=billed, amount_micros=12_340_000, reason="support credit", key="test:credit"
    )
    entries = LedgerEntry.objects.filter(workspace=billed).count()
    assert tasks.mirror_to_stripe() == entries
    assert tasks.mirror_to_stripe() == 0  # all mirrored: nothing is sent again
    transactions = [r for r in stripe_api.requests if r["path"].endswith("balance_transactions")]
    assert len(transactions) == entries
    credit = next(r for r in transactions if r["body"]["amount"] == ["-1234"])
    entry = LedgerEntry.objects.get(idempotency_key="test:credit")
    assert f"-ledger-{entry.pk}-" in credit["key"]  # one key per entry: a retry is one transaction
    assert StripeMirror.objects.count() == entries


def balance_transactions(stripe_api, customer: str | None = None) -> list[dict]:
    """The balance transactions Stripe took (answered 200), for one customer or all."""
    return [
        r
        for r in stripe_api.requests
        if r["path"].endswith("/balance_transactions")
        and (customer is None or f"/customers/{customer}/" in r["path"])
        and r["status"] == 200
    ]


def test_sub_cent_entries_reach_stripe_as_the_rounded_running_sum(billed, stripe_api):
    for i, micros in enumerate([4_000, 4_000, 4_000, 5_000]):  # 0.4, 0.4, 0.4 and 0.5 cents
        services.add_credit(workspace=billed, amount_micros=micros, reason="", key=f"test:{i}")
    assert tasks.mirror_to_stripe() == 5
    # The running sum in cents (half up): 10000, 10000.4, 10000.8, 10001.2, 10001.7 → 10002.
    # Only its whole-cent moves are sent, and never 0.
    sent = [r["body"]["amount"] for r in balance_transactions(stripe_api)]
    assert sent == [["-10000"], ["-1"], ["-1"]]
    balance = services.balance_micros(workspace=billed)
    assert -sum(int(amount) for [amount] in sent) == cents_half_up(balance) == 10002
    assert sum(StripeMirror.objects.values_list("amount_cents", flat=True)) == 10002


def test_one_workspace_stripe_refuses_waits_and_the_others_are_mirrored(
    billed, stripe_api, monkeypatch
):
    other, _ = veri_services.create_workspace(name="other")
    services.open_billing_account(workspace=other, credit_micros=50_000_000)
    assert tasks.mirror_to_stripe() == 2  # both opening credits; both customers exist now
    failing = BillingAccount.objects.get(workspace=billed)
    credits = [(other, 1), (billed, 2), (billed, 3), (other, 4)]
    for workspace, usd in credits:
        services.add_credit(
            workspace=workspace, amount_micros=usd * 1_000_000, reason="", key=f"test:{usd}"
        )
    keys = {
        usd: f"-ledger-{LedgerEntry.objects.get(idempotency_key=f'test:{usd}').pk}-"
        for _, usd in credits
    }
    monkeypatch.setattr(stripe_api, "unavailable_for", {failing.stripe_customer_id})
    assert tasks.mirror_to_stripe() == 2  # the other workspace's two, each committed on its own
    failing.refresh_from_db()
    assert "unavailable" in failing.stripe_mirror_error
    assert not StripeMirror.objects.filter(entry__idempotency_key__in=["test:2", "test:3"])
    monkeypatch.setattr(stripe_api, "unavailable_for", set())
    assert tasks.mirror_to_stripe() == 2  # the refused ones, on the next run
    assert tasks.mirror_to_stripe() == 0
    failing.refresh_from_db()
    assert failing.stripe_mirror_error == ""
    sent = [r["key"] for r in stripe_api.requests if r["path"].endswith("balance_transactions")]
    assert [sum(keys[usd] in key for key in sent) for usd in (1, 2, 3, 4)] == [1, 2, 1, 1]
    for workspace in (billed, other):
        customer = BillingAccount.objects.get(workspace=workspace).stripe_customer_id
        amounts = [int(r["body"]["amount"][0]) for r in balance_transactions(stripe_api, customer)]
        assert -sum(amounts) == cents_half_up(services.balance_micros(workspace=workspace))


@postgres_only
@pytest.mark.django_db(transaction=True)
def test_mirroring_runs_at_once_send_each_entry_once(billed, stripe_api):
    for i in range(6):
        services.add_credit(workspace=billed, amount_micros=1_234_567, reason="", key=f"test:{i}")
    assert sum(in_threads(4, lambda i: tasks.mirror_to_stripe())) == 7
    sent = [r["key"] for r in stripe_api.requests if r["path"].endswith("balance_transactions")]
    assert len(sent) == len(set(sent)) == 7
    amounts = [int(r["body"]["amount"][0]) for r in balance_transactions(stripe_api)]
    assert -sum(amounts) == cents_half_up(services.balance_micros(workspace=billed))


def test_low_balance_is_below_a_day_of_recent_spend(api_client, billed):
    assert api_client.get("/v1/billing").json()["low_balance"] is False
    balance = services.balance_micros(workspace=billed)
    services.record_entry(
        workspace=billed,
        kind=LedgerEntry.Kind.JOB_CHARGE,
        amount_micros=-(balance - 1_000_000),  # a week's spend in a day, 1 USD left
        key="test:spend",
    )
    assert api_client.get("/v1/billing").json()["low_balance"] is True


def test_create_workspace_credit_is_an_adjustment(db):
    from django.core.management import call_command

    call_command("create_workspace", "credited", "--credit", "12.5")
    workspace = Workspace.objects.get(name="credited")
    [entry] = LedgerEntry.objects.filter(workspace=workspace)
    assert (entry.kind, entry.amount_micros) == ("adjustment", 12_500_000)
