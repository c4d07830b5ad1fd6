"""A Content-Security-Policy on the dashboard and the admin: scripts and styles from this origin's
static files only. Every template is kept free of what the policy refuses (inline scripts, `on…=`
handlers, `style` attributes or elements, `javascript:` URLs); a browser test
(tests/browser/test_csp.py) sees the pages work under it with no violation."""

import re
from pathlib import Path

import pytest
from django.contrib.auth.models import User

from tests.dashboard.conftest import signed_in

pytestmark = pytest.mark.django_db
REPO = Path(__file__).resolve().parents[2]
TEMPLATE_ROOTS = [REPO / "templates", REPO / "dashboard", REPO / "billing", REPO / "training"]

REFUSED = {
    "an inline <script>": re.compile(r"<script(?![^>]*\bsrc=)[^>]*>", re.I),
    "an on…= handler": re.compile(r"<[^>]*\son[a-z]+\s*=", re.I),
    "a style attribute": re.compile(r"<[^>]*\sstyle\s*=", re.I),
    "a <style> element": re.compile(r"<style\b", re.I),
    "a javascript: URL": re.compile(r"javascript:", re.I),
}


def policy(response) -> dict[str, list[str]]:
    header = response["Content-Security-Policy"]
    return {
        name: values
        for name, *values in (part.split() for part in header.split(";") if part.strip())
    }


def test_dashboard_and_admin_pages_carry_the_policy(owner):
    superuser = User.objects.create_superuser("root", password="root-password-1")
    pages = [
        (signed_in(owner), "/jobs/"),
        (signed_in(owner), "/billing/"),
        (signed_in(superuser), "/admin/"),
        (signed_in(superuser), "/admin/billing/ledgerentry/"),
    ]
    for client, url in pages + [(signed_in(owner), "/accounts/login/")]:
        response = client.get(url)
        assert response.status_code == 200, url
        directives = policy(response)
        assert directives["script-src"] == ["'self'"], url
        assert directives["style-src"] == ["'self'"], url
        assert directives["object-src"] == ["'none'"] and directives["base-uri"] == ["'none'"]
        assert directives["frame-ancestors"] == ["'none'"]
        assert "'unsafe-inline'" not in response["Content-Security-Policy"]
        # What the policy would refuse is not on the page either.
        page = response.content.decode()
        for what, pattern in REFUSED.items():
            assert not pattern.search(page), f"{url} has {what}: {pattern.search(page)}"


@pytest.mark.parametrize(
    "template",
    sorted(p for root in TEMPLATE_ROOTS for p in root.rglob("*.html")),
    ids=lambda p: str(p.relative_to(REPO)),
)
def test_no_template_needs_what_the_policy_refuses(template):
    text = template.read_text()
    for what, pattern in REFUSED.items():
        found = pattern.search(text)
        assert not found, f"{template.relative_to(REPO)} has {what}: {found.group(0)!r}"
