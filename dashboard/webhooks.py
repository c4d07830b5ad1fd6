"""Dashboard pages of webhook endpoints: register (the secret shown once), send a test event,
delete, and each endpoint's recent deliveries with every attempt."""

from django.contrib import messages
from django.shortcuts import redirect, render
from django.utils.cache import add_never_cache_headers
from django.views.decorators.http import require_POST

from dashboard.forms import WebhookEndpointForm
from dashboard.workspaces import or_404, workspace_view
from veri.errors import VeriError
from webhooks import selectors, services

NEW_SECRET = "veri_new_webhook_secret"
RECENT_DELIVERIES = 50


def _endpoint(request, endpoint_id: str):
    return or_404(selectors.get_endpoint, workspace=request.workspace, endpoint_id=endpoint_id)


@workspace_view
def webhook_list(request):
    """A new endpoint's secret is shown by the GET the POST redirects to, once (as API keys)."""
    form = WebhookEndpointForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            endpoint, secret = services.create_endpoint(
                workspace=request.workspace,
                url=form.cleaned_data["url"],
                event_types=form.cleaned_event_types(),
                description=form.cleaned_data["description"],
            )
        except VeriError as exc:
            form.add_error(exc.field if exc.field in form.fields else None, exc.message)
        else:
            request.session[NEW_SECRET] = [endpoint.public_id, secret]
            return redirect("dashboard:webhooks")
    endpoints = selectors.list_endpoints(workspace=request.workspace).order_by("-pk")
    new_secret = request.session.pop(NEW_SECRET, None)
    response = render(
        request,
        "dashboard/webhooks.html",
        {"endpoints": endpoints, "form": form, "new_secret": new_secret},
        status=400 if form.errors else 200,
    )
    add_never_cache_headers(response)
    return response


@workspace_view
def webhook_detail(request, endpoint_id: str):
    endpoint = _endpoint(request, endpoint_id)
    deliveries = selectors.list_deliveries(endpoint=endpoint).order_by("-pk")[:RECENT_DELIVERIES]
    return render(
        request, "dashboard/webhook.html", {"endpoint": endpoint, "deliveries": deliveries}
    )


@require_POST
@workspace_view
def webhook_test(request, endpoint_id: str):
    endpoint = _endpoint(request, endpoint_id)
    services.send_test(endpoint=endpoint)
    messages.success(request, "Queued a webhook.test event; it shows below once tried.")
    return redirect("dashboard:webhook", endpoint_id=endpoint.public_id)


@require_POST
@workspace_view
def webhook_delete(request, endpoint_id: str):
    endpoint = _endpoint(request, endpoint_id)
    services.delete_endpoint(endpoint=endpoint)
    messages.success(request, f"Deleted the webhook endpoint {endpoint.url}.")
    return redirect("dashboard:webhooks")
