"""A billing account in the Django admin is read-only but for its Stripe customer, which an
operator changes only with a reason, kept with the old and new value in the account's History.
Nothing about money is edited there (the balance is the ledger's sum; credit is an action that
writes a ledger entry), the watchdog's fields are shown, not edited, and accounts are never
deleted."""

from datetime import timedelta

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission, User
from django.utils import timezone

from billing import services
from billing.models import BillingAccount
from veri import services as veri_services

pytestmark = pytest.mark.django_db
ACCOUNTS = "/admin/billing/billingaccount/"


@pytest.fixture
def operator(client) -> User:
    user = User.objects.create_user("op", is_staff=True)
    user.user_permissions.set(
        Permission.objects.filter(
            codename__in=["view_billingaccount", "change_billingaccount", "add_billingaccount"]
        )
    )
    client.force_login(user)
    return user


@pytest.fixture
def account(billed) -> BillingAccount:
    account = billed.billing_account
    since = timezone.now() - timedelta(hours=1)
    BillingAccount.objects.filter(pk=account.pk).update(
        stripe_customer_id="cus_Old1", exhausted_since=since, stripe_mirror_error="card declined"
    )
    account.refresh_from_db()
    return account


def change(client, account: BillingAccount, **fields):
    return client.post(f"{ACCOUNTS}{account.pk}/change/", fields)


def test_only_the_stripe_customer_is_editable_and_the_rest_is_shown(client, operator, account):
    page = client.get(f"{ACCOUNTS}{account.pk}/change/").content.decode()
    assert 'name="stripe_customer_id"' in page and 'name="reason"' in page
    for shown_only in ("workspace", "exhausted_since", "stripe_mirror_error", "created_at"):
        assert f'name="{shown_only}' not in page, shown_only
    assert "card declined" in page and "100.00 USD" in page  # the watchdog's note, the balance

    other, _ = veri_services.create_workspace(name="other")
    before = services.balance_micros(workspace=account.workspace)
    response = change(
        client,
        account,
        stripe_customer_id="cus_New2",
        reason="the customer was re-created in Stripe after a merge",
        workspace=str(other.pk),
        exhausted_since_0="2030-01-01",
        exhausted_since_1="00:00:00",
        stripe_mirror_error="",
    )
    assert response.status_code == 302
    after = BillingAccount.objects.get(pk=account.pk)
    assert after.stripe_customer_id == "cus_New2"
    assert (after.workspace_id, after.exhausted_since, after.stripe_mirror_error) == (
        account.workspace_id,
        account.exhausted_since,
        "card declined",
    )
    assert services.balance_micros(workspace=account.workspace) == before


def test_a_change_needs_a_reason_and_the_history_keeps_it(client, operator, account):
    refused = change(client, account, stripe_customer_id="cus_New2")
    assert refused.status_code == 200 and "This field is required" in refused.content.decode()
    assert BillingAccount.objects.get(pk=account.pk).stripe_customer_id == "cus_Old1"
    bad = change(client, account, stripe_customer_id="acct_123", reason="typo")
    assert "looks like cus_" in bad.content.decode()

    change(client, account, stripe_customer_id="cus_New2", reason="re-created after a merge")
    [entry] = LogEntry.objects.filter(object_id=str(account.pk))
    assert entry.user == operator
    message = entry.get_change_message()
    assert "'cus_Old1' to 'cus_New2'" in message and "Reason: re-created after a merge" in message
    history = client.get(f"{ACCOUNTS}{account.pk}/history/").content.decode()
    assert "Reason: re-created after a merge" in history


def test_accounts_are_never_deleted_from_the_admin(client, account):
    superuser = User.objects.create_superuser("root", password="root-password-1")
    client.force_login(superuser)
    assert client.get(f"{ACCOUNTS}{account.pk}/delete/").status_code == 403
    assert b'value="delete_selected"' not in client.get(ACCOUNTS).content
    client.post(ACCOUNTS, {"action": "delete_selected", "_selected_action": [str(account.pk)]})
    assert BillingAccount.objects.filter(pk=account.pk).exists()


def test_an_operator_opens_an_account_for_a_workspace_without_one_with_a_reason(client, operator):
    workspace, _ = veri_services.create_workspace(name="beta")
    response = client.post(
        f"{ACCOUNTS}add/", {"workspace": str(workspace.pk), "reason": "signed the pilot contract"}
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    account = BillingAccount.objects.get(workspace=workspace)
    assert services.balance_micros(workspace=workspace) == 0  # an account, no money
    [entry] = LogEntry.objects.filter(object_id=str(account.pk))
    assert "Reason: signed the pilot contract" in entry.get_change_message()
