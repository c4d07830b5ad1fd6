"""Dashboard pages of the workspace itself: billing, API keys, secrets, and switching
workspaces."""

from django.contrib import messages
from django.core.paginator import Paginator
from django.http import Http404, HttpResponseRedirect
from django.shortcuts import redirect, render
from django.utils.cache import add_never_cache_headers
from django.views.decorators.http import require_POST

from billing import selectors as billing_selectors
from billing import services as billing
from billing.stripe_gateway import payments_enabled
from dashboard import workspaces
from dashboard.forms import ApiKeyForm, SecretForm, TopUpForm
from dashboard.templatetags.dashboard import dollars
from dashboard.workspaces import or_404, workspace_view
from veri import selectors, services
from veri.errors import VeriError


@workspace_view
def home(request):
    return redirect("dashboard:jobs")


@workspace_view
def billing_page(request):
    balance = billing.balance_micros(workspace=request.workspace)
    ledger = billing_selectors.list_ledger(workspace=request.workspace).order_by("-pk")
    form = TopUpForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            url = billing.top_up_url(
                workspace=request.workspace,
                amount_usd=form.cleaned_data["amount_usd"],
                return_url=request.build_absolute_uri("/billing/"),
            )
            return HttpResponseRedirect(url)
        except VeriError as exc:
            form.add_error("amount_usd", exc.message)
    page = Paginator(ledger, 50).get_page(request.GET.get("page"))
    for entry in page:
        entry.amount_usd = dollars(entry.amount_micros)
    spend = billing_selectors.spend_micros(workspace=request.workspace)
    return render(
        request,
        "dashboard/billing.html",
        {
            "balance_usd": dollars(balance),
            "low_balance": billing.is_low_balance(
                workspace=request.workspace,
                balance=balance,
                accrued_micros=billing_selectors.unbilled(
                    workspace=request.workspace
                ).accrued_micros,
            ),
            "payments_enabled": payments_enabled(),
            "form": form,
            "page": page,
            "spend": [
                ("Training", spend["jobs"]),
                ("Deployments", spend["deployments"]),
                ("Tinker", spend["tinker"]),
                ("Storage", spend["storage"]),
            ],
        },
    )


NEW_KEY = "veri_new_api_key"


@workspace_view
def api_keys(request):
    """A new key is made on POST and shown by the GET it redirects to, once: the session hands
    it over and forgets it, and no cache keeps the page (a reload or Back shows it no more)."""
    form = ApiKeyForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        _, raw_key = services.create_api_key(
            workspace=request.workspace, name=form.cleaned_data["name"]
        )
        request.session[NEW_KEY] = raw_key
        return redirect("dashboard:keys")
    keys = selectors.list_api_keys(workspace=request.workspace)
    new_key = request.session.pop(NEW_KEY, None)
    response = render(
        request, "dashboard/keys.html", {"keys": keys, "form": form, "new_key": new_key}
    )
    add_never_cache_headers(response)
    return response


@require_POST
@workspace_view
def api_key_revoke(request, prefix: str):
    key = or_404(selectors.get_api_key, workspace=request.workspace, prefix=prefix)
    services.revoke_api_key(api_key=key)
    messages.success(
        request, f"Revoked the key {key.prefix}{f' ({key.name})' if key.name else ''}."
    )
    return redirect("dashboard:keys")


@workspace_view
def secrets_page(request):
    """Set (create or replace) a secret; the list shows names and times, never a value."""
    form = SecretForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        name = form.cleaned_data["name"]
        try:
            services.set_secret(
                workspace=request.workspace, name=name, value=form.cleaned_data["value"]
            )
        except VeriError as exc:
            form.add_error(exc.field if exc.field in form.fields else None, exc.message)
        else:
            messages.success(request, f"Set the secret {name}.")
            return redirect("dashboard:secrets")
    secrets = selectors.list_secrets(workspace=request.workspace).order_by("name")
    return render(request, "dashboard/secrets.html", {"secrets": secrets, "form": form})


@require_POST
@workspace_view
def secret_delete(request, name: str):
    or_404(services.delete_secret, workspace=request.workspace, name=name)
    messages.success(request, f"Deleted the secret {name}.")
    return redirect("dashboard:secrets")


@require_POST
@workspace_view
def switch_workspace(request):
    if not workspaces.choose(request, request.POST.get("workspace", "")):
        raise Http404
    return redirect("dashboard:jobs")
