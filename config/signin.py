"""Sign-in throttling for the dashboard's and the admin's sign-in pages, with django-axes.

Failed sign-ins are counted per account and per client address (`VERI_SIGNIN_FAILURE_LIMIT`
within `VERI_SIGNIN_LOCKOUT_MINUTES`); at the limit, that account (from anywhere) and that address
(for any account) cannot sign in, even with the right password, until the newest counted failure
is that old. Successful sign-ins are never counted, and do not wipe the count either (an attacker
signing in to an account of their own must not reset the count of the account they are guessing).
Attempts during a lockout do not extend it, so "try again in N minutes" is a promise. An operator
unlocks by removing the failures in the admin (Axes › Access attempts › "Unlock").
"""

import math
from datetime import datetime, timedelta

from axes.backends import AxesStandaloneBackend
from axes.handlers.proxy import AxesProxyHandler
from axes.helpers import get_cool_off, get_failure_limit
from django.conf import settings
from django.contrib import admin
from django.contrib.admin.forms import AdminAuthenticationForm
from django.contrib.auth import REDIRECT_FIELD_NAME
from django.contrib.auth.forms import AuthenticationForm
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import reverse
from django.utils import timezone


class SignInThrottle(AxesStandaloneBackend):
    """The first authentication backend: refuses every sign-in of a locked-out account or
    address (Django then asks no other backend). Authentication itself is `EmailBackend`'s.
    Without a request (a management command, a test's `Client.login`) there is no one to count."""

    def authenticate(self, request, username=None, password=None, **kwargs):
        if request is None:
            return None
        return super().authenticate(request, username=username, password=password, **kwargs)


def username_of(request: HttpRequest, credentials: dict | None) -> str | None:
    """The account a sign-in is for, as `EmailBackend` reads it: `Ada@Example.com ` and
    `ada@example.com` are one account, so changing the case does not start a new count."""
    raw = (credentials or {}).get("username")
    if raw is None and request is not None and request.method == "POST":
        raw = request.POST.get("username")
    return raw.strip().lower() if isinstance(raw, str) else None


def client_ip(request: HttpRequest) -> str:
    """The address failures are counted per: the connection's own, or behind
    `VERI_TRUSTED_PROXY_COUNT` proxies the address the outermost of them saw (X-Forwarded-For's
    entry that many from the right; those to its left are the client's to write)."""
    count = settings.VERI_TRUSTED_PROXY_COUNT
    if count:
        hops = [h.strip() for h in request.META.get("HTTP_X_FORWARDED_FOR", "").split(",")]
        hops = [h for h in hops if h]
        if len(hops) >= count:
            return hops[-count]
    return request.META.get("REMOTE_ADDR", "")


def _lifts_at(attempts: QuerySet, limit: int, cool_off: timedelta) -> datetime | None:
    """When these counted failures stop adding up to the limit: Axes counts a row (one client's
    failures) until its newest failure is `cool_off` old, so rows drop out oldest first."""
    rows = list(
        attempts.order_by("attempt_time").values_list("attempt_time", "failures_since_start")
    )
    total, lifts = sum(failures for _, failures in rows), None
    for attempt_time, failures in rows:
        if total < limit:
            break
        lifts, total = attempt_time + cool_off, total - failures
    return lifts


def minutes_left(request: HttpRequest, credentials: dict | None) -> int:
    """Whole minutes (at least one) until this request's account and address may sign in."""
    cool_off = get_cool_off(request) or timedelta(0)
    limit = get_failure_limit(request, credentials)
    handler = AxesProxyHandler.get_implementation()
    ends = [
        lifts
        for attempts in handler.get_user_attempts(request, credentials)
        if (lifts := _lifts_at(attempts, limit, cool_off))
    ]
    seconds = (max(ends) - timezone.now()).total_seconds() if ends else cool_off.total_seconds()
    return max(1, math.ceil(seconds / 60))


def locked_out(
    request: HttpRequest,
    original_response: HttpResponse | None = None,
    credentials: dict | None = None,
) -> HttpResponse:
    """The sign-in page again (the dashboard's or the admin's), saying how long to wait: 429 with
    `Retry-After`."""
    minutes = minutes_left(request, credentials)
    message = (
        "Too many failed sign-in attempts for this account or from this address. Try again in "
        f"{minutes} minute{'' if minutes == 1 else 's'}."
    )
    next_url = request.POST.get(REDIRECT_FIELD_NAME) or request.GET.get(REDIRECT_FIELD_NAME, "")
    if request.path.startswith(reverse("admin:index")):
        context = {
            **admin.site.each_context(request),
            "title": "Log in",
            "app_path": request.get_full_path(),
            "form": AdminAuthenticationForm(request),
            REDIRECT_FIELD_NAME: next_url or reverse("admin:index"),
            "locked_out": message,
        }
        response = render(request, "admin/locked_out.html", context, status=429)
    else:
        context = {"form": AuthenticationForm(request), "next": next_url, "locked_out": message}
        response = render(request, "registration/login.html", context, status=429)
    response["Retry-After"] = str(minutes * 60)
    return response
