"""Sign-in throttling on the dashboard's and the admin's sign-in pages. The attack that worked: 60
wrong passwords for one account all answered the form, and the right one still signed in. Now,
after a few failures per account or per address, the page says "too many attempts, try again in N
minutes" (429, Retry-After) and the right password does not sign in until then; an operator can
unlock from the admin. Successful sign-ins never count (the browser and end-to-end tests sign in
many times)."""

from datetime import timedelta

import pytest
from axes.models import AccessAttempt
from django.contrib.auth.models import User
from django.db.models import F
from django.test import Client

from tests.dashboard.conftest import PASSWORD, member_of

pytestmark = pytest.mark.django_db

EMAIL = "owner@acme.test"
LIMIT = 5  # VERI_SIGNIN_FAILURE_LIMIT's default


def sign_in(client: Client, username: str, password: str, *, admin: bool = False):
    url = "/admin/login/?next=/admin/" if admin else "/accounts/login/"
    return client.post(url, {"username": username, "password": password, "next": "/jobs/"})


def signed_in(client: Client) -> bool:
    return "_auth_user_id" in client.session


def assert_locked(response, minutes: int) -> str:
    assert response.status_code == 429
    assert response["Retry-After"] == str(minutes * 60)
    page = response.content.decode()
    wait = "1 minute." if minutes == 1 else f"{minutes} minutes."
    assert "Too many failed sign-in attempts" in page and f"Try again in {wait}" in page, page
    return page


def age_failures(minutes: int) -> None:
    """As if the counted failures happened `minutes` earlier."""
    AccessAttempt.objects.update(attempt_time=F("attempt_time") - timedelta(minutes=minutes))


def test_the_dashboard_locks_an_account_then_lets_it_in_after_the_wait(workspace):
    member_of(workspace, EMAIL)
    attacker = Client(REMOTE_ADDR="203.0.113.7")
    for _ in range(LIMIT - 1):
        response = sign_in(attacker, EMAIL, "guess")
        assert response.status_code == 200
        assert "do not match an account" in response.content.decode()
    page = assert_locked(sign_in(attacker, EMAIL, "guess"), 15)
    assert 'name="password"' in page  # the sign-in form, saying why

    # The owner, from elsewhere, with the right password (spelt in another case): refused.
    owner = Client(REMOTE_ADDR="198.51.100.2")
    assert_locked(sign_in(owner, "Owner@ACME.test", PASSWORD), 15)
    assert not signed_in(owner)
    assert owner.get("/jobs/").status_code == 302  # to the sign-in page

    age_failures(10)  # attempts during the lockout did not extend it
    assert_locked(sign_in(owner, EMAIL, PASSWORD), 5)
    age_failures(5)
    response = sign_in(owner, EMAIL, PASSWORD)
    assert response.status_code == 302 and signed_in(owner)


def test_one_address_guessing_many_accounts_is_locked_for_every_account(workspace):
    member_of(workspace, EMAIL)
    attacker = Client(REMOTE_ADDR="203.0.113.7")
    for index in range(LIMIT):
        sign_in(attacker, f"someone-{index}@acme.test", "guess")
    assert_locked(sign_in(attacker, EMAIL, PASSWORD), 15)
    assert not signed_in(attacker)
    # A forged X-Forwarded-For is not another address (no proxy is trusted by default).
    forged = Client(REMOTE_ADDR="203.0.113.7", HTTP_X_FORWARDED_FOR="192.0.2.55")
    assert_locked(sign_in(forged, EMAIL, PASSWORD), 15)
    owner = Client(REMOTE_ADDR="198.51.100.2")  # the account itself is not locked
    assert sign_in(owner, EMAIL, PASSWORD).status_code == 302 and signed_in(owner)


def test_behind_a_trusted_proxy_the_proxys_view_of_the_client_counts(workspace, settings):
    settings.VERI_TRUSTED_PROXY_COUNT = 1
    member_of(workspace, EMAIL)
    for index in range(LIMIT):
        # The client's own part of the header varies; what the proxy appended does not.
        attacker = Client(
            REMOTE_ADDR="10.0.0.1", HTTP_X_FORWARDED_FOR=f"192.0.2.{index}, 203.0.113.7"
        )
        sign_in(attacker, f"someone-{index}@acme.test", "guess")
    attacker = Client(REMOTE_ADDR="10.0.0.1", HTTP_X_FORWARDED_FOR="203.0.113.7")
    assert_locked(sign_in(attacker, EMAIL, PASSWORD), 15)
    colleague = Client(REMOTE_ADDR="10.0.0.1", HTTP_X_FORWARDED_FOR="198.51.100.2")
    assert sign_in(colleague, EMAIL, PASSWORD).status_code == 302


def test_signing_in_to_ones_own_account_does_not_reset_the_guessing(workspace):
    member_of(workspace, EMAIL)
    member_of(workspace, "attacker@acme.test")
    attacker = Client(REMOTE_ADDR="203.0.113.7")
    for _ in range(LIMIT - 1):
        sign_in(attacker, EMAIL, "guess")
    assert sign_in(attacker, "attacker@acme.test", PASSWORD).status_code == 302
    assert_locked(sign_in(Client(REMOTE_ADDR="203.0.113.7"), EMAIL, "guess"), 15)


def test_successful_sign_ins_are_never_counted(workspace):
    member_of(workspace, EMAIL)
    for _ in range(3 * LIMIT):
        client = Client(REMOTE_ADDR="127.0.0.1")
        assert sign_in(client, EMAIL, PASSWORD).status_code == 302 and signed_in(client)
    assert not AccessAttempt.objects.exists()


def test_the_admin_locks_a_staff_account_and_an_operator_unlocks_it(db):
    User.objects.create_user("op", password="op-password-1", is_staff=True)
    User.objects.create_superuser("chief", password="chief-password-1")
    attacker = Client(REMOTE_ADDR="203.0.113.7")
    for _ in range(LIMIT - 1):
        response = sign_in(attacker, "op", "guess", admin=True)
        assert response.status_code == 200 and "errornote" in response.content.decode()
    assert_locked(sign_in(attacker, "op", "guess", admin=True), 15)
    op = Client(REMOTE_ADDR="198.51.100.2")
    page = assert_locked(sign_in(op, "op", "op-password-1", admin=True), 15)
    assert 'id="login-form"' in page  # the admin's own sign-in form
    assert not signed_in(op)

    chief = Client(REMOTE_ADDR="198.51.100.9")
    assert sign_in(chief, "chief", "chief-password-1", admin=True).status_code == 302
    listing = chief.get("/admin/axes/accessattempt/")
    assert listing.status_code == 200 and "op" in listing.content.decode()
    rows = list(AccessAttempt.objects.filter(username="op").values_list("pk", flat=True))
    response = chief.post(
        "/admin/axes/accessattempt/",
        {"action": "unlock", "_selected_action": [str(pk) for pk in rows]},
        follow=True,
    )
    assert "Unlocked op from 203.0.113.7" in response.content.decode()
    response = sign_in(op, "op", "op-password-1", admin=True)
    assert response.status_code == 302 and signed_in(op)
