"""The Tinker page: the workspace's Tinker keys, its saved states (each to download or deploy),
and its sessions with their models (status, operations, tokens, cost) and saved checkpoints."""

from django.contrib import messages
from django.core.paginator import Paginator
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils.cache import add_never_cache_headers
from django.views.decorators.http import require_POST

from dashboard.deployments import deploy_adapter
from dashboard.forms import ApiKeyForm
from dashboard.workspaces import int_param, or_404, workspace_view
from tinker_api import selectors
from tinker_api.services import checkpoints, keys

NEW_KEY = "veri_new_tinker_key"
SESSIONS_PER_PAGE = 20
SAVED_SHOWN = 50  # the newest; the tinker client's RestClient lists them all


@workspace_view
def tinker_page(request):
    """A new key is made on POST and shown once by the GET it redirects to, as API keys are."""
    form = ApiKeyForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        _, raw = keys.create_key(workspace=request.workspace, name=form.cleaned_data["name"])
        request.session[NEW_KEY] = raw
        return redirect("dashboard:tinker")
    sessions = selectors.list_sessions(workspace=request.workspace)
    page = Paginator(sessions, SESSIONS_PER_PAGE).get_page(int_param(request, "page", 1))
    models = [model for session in page for model in session.models.all()]
    costs = selectors.model_costs_micros(
        workspace=request.workspace, model_ids=[m.model_id for m in models]
    )
    for model in models:
        model.cost_micros = costs.get(model.model_id)
    context = {
        "form": form,
        "keys": selectors.list_keys(workspace=request.workspace),
        "new_key": request.session.pop(NEW_KEY, None),
        "page": page,
        "saved": selectors.list_checkpoints(workspace=request.workspace)[:SAVED_SHOWN],
        "saved_shown": SAVED_SHOWN,
    }
    response = render(request, "dashboard/tinker.html", context)
    add_never_cache_headers(response)
    return response


@require_POST
@workspace_view
def tinker_key_revoke(request, key_id: str):
    key = or_404(selectors.get_key, workspace=request.workspace, key_id=key_id)
    keys.revoke_key(key=key)
    named = f" ({key.name})" if key.name else ""
    messages.success(request, f"Revoked the Tinker key {key}{named}.")
    return redirect("dashboard:tinker")


def _checkpoint(request, model_id: str, checkpoint_id: str):
    return or_404(
        selectors.get_checkpoint,
        workspace=request.workspace,
        model_id=model_id,
        checkpoint_id=checkpoint_id,
    )


@workspace_view
def tinker_checkpoint_download(request, model_id: str, checkpoint_id: str):
    """The adapter's archive, signed at the click: links on a page left open still work."""
    return redirect(checkpoints.archive_url(_checkpoint(request, model_id, checkpoint_id)))


@require_POST
@workspace_view
def tinker_checkpoint_deploy(request, model_id: str, checkpoint_id: str):
    """Deploy the saved state's adapter, as a job's Deploy button does."""
    checkpoint = _checkpoint(request, model_id, checkpoint_id)
    return deploy_adapter(
        request, checkpoints.adapter_name(checkpoint), back=reverse("dashboard:tinker")
    )
