"""Operators' billing actions in the Django admin, through Django's test client."""

import re

import pytest
from django.contrib.auth.models import Permission, User

from billing.models import AttributionChange, Refund
from tests.billing.test_ledger import failed_after_an_hour, kinds

pytestmark = pytest.mark.django_db
JOBS = "/admin/training/trainingjob/"


def staff(username: str, *permissions: str) -> User:
    user = User.objects.create_user(username, is_staff=True)
    user.user_permissions.set(Permission.objects.filter(codename__in=permissions))
    return user


def test_a_customer_failure_is_reattributed_from_the_jobs_admin(submit, billed, client):
    oom = failed_after_an_hour(submit, "oom")  # the customer's: charged, no refund row
    queued = submit()  # not failed: nothing to attribute
    assert not Refund.objects.filter(job=oom).exists()
    form = {
        "action": "reattribute",
        "_selected_action": [str(oom.pk), str(queued.pk)],
        "apply": "1",
        "attribution": "platform",
        "reason": "the host's GPU was faulty",
    }

    client.force_login(staff("viewer", "view_trainingjob"))
    assert b'value="reattribute"' not in client.get(JOBS).content
    client.post(JOBS, form)
    assert not AttributionChange.objects.exists() and not Refund.objects.exists()

    operator = staff("operator", "view_trainingjob", "review_refund")
    client.force_login(operator)
    assert b'value="reattribute"' in client.get(JOBS).content
    asked = client.post(JOBS, {k: v for k, v in form.items() if k != "apply"})
    assert b"Re-attribute jobs" in asked.content and not AttributionChange.objects.exists()
    done = client.post(JOBS, form, follow=True)
    shown = [str(m) for m in done.context["messages"]]
    assert "Re-attributed 1 job(s)." in shown
    assert any(queued.public_id in m and "did not fail" in m for m in shown)

    oom.refresh_from_db()
    assert oom.error_attribution == "platform"
    assert Refund.objects.get(job=oom).status == "credited"
    assert kinds(oom) == [
        ("job_charge", -oom.billing.cost_micros),
        ("refund_credit", oom.billing.cost_micros),
    ]
    change = AttributionChange.objects.get()
    assert (change.job, change.from_attribution, change.changed_by) == (oom, "customer", operator)


def test_the_jobs_admin_shows_events_as_json_and_offers_no_delete(submit, billed, client):
    failed = failed_after_an_hour(submit, "provider_reclaimed")  # billed, with a pending refund
    client.force_login(User.objects.create_superuser("root", "root@example.com", "pw"))
    listing = client.get(JOBS).content.decode()
    assert failed.public_id in listing and 'value="delete_selected"' not in listing
    assert client.get(f"{JOBS}{failed.pk}/delete/").status_code == 403
    page = client.get(f"{JOBS}{failed.pk}/change/").content.decode()
    assert re.search(r'<pre class="veri-json">\{\s*&quot;from&quot;: &quot;\w+&quot;', page)
    assert "{&#x27;" not in page  # an event's detail as JSON, never a Python repr
    refund = Refund.objects.get(job=failed)
    review = client.get(f"/admin/billing/refund/{refund.pk}/change/").content.decode()
    assert "&quot;code&quot;: &quot;provider_reclaimed&quot;" in review, review
    assert "{&#x27;" not in review
    favicon = client.get("/favicon.ico")
    assert favicon.status_code == 200 and favicon["Content-Type"] == "image/svg+xml"
