"""Dashboard pages of deployments (the list, a deployment's page with its settings, replicas,
events and cost, Delete), the job page's Deploy button, and the playground: two models side by
side, each answer streamed from a replica through serving's router, signed in by the session.
Reads go through the workspace's selectors (another workspace's deployment is 404); changes
through serving's services."""

import json
from urllib.parse import urlencode

from django import forms
from django.contrib import messages
from django.http import HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_POST

from billing import selectors as billing_selectors
from dashboard import progress
from dashboard.jobs import timeline, workspace_job
from dashboard.workspaces import or_404, workspace_view
from serving import selectors
from serving.models import Deployment, DeploymentStatus, ReplicaStatus
from serving.services import deployments as services
from serving.services import inference, limits
from training import errors
from veri.errors import Conflict, ServiceUnavailable, VeriError

# What a playground pane sends on to the model (it always streams); the replica validates them.
PLAYGROUND_FIELDS = ("messages", "temperature", "max_tokens")


class SettingsForm(forms.Form):
    min_replicas = forms.IntegerField(min_value=0, max_value=services.MAX_REPLICAS)
    max_replicas = forms.IntegerField(min_value=1, max_value=services.MAX_REPLICAS)
    idle_timeout_seconds = forms.IntegerField(
        label="Idle timeout (seconds)", min_value=10, max_value=7 * 86400
    )


def _deployment(request, deployment_id: str) -> Deployment:
    return or_404(
        selectors.get_deployment, workspace=request.workspace, deployment_id=deployment_id
    )


def _cost_micros(deployment: Deployment, charged: dict[str, int], now) -> int:
    """Its replicas' charged uptime (the ledger's) and what the ready ones ran up since."""
    replicas = list(deployment.replicas.all())  # prefetched on the list page
    return sum(charged.get(r.public_id, 0) for r in replicas) + selectors.uncharged_micros(
        replicas=replicas, now=now
    )


@workspace_view
def deployment_list(request):
    deployments = list(
        selectors.list_deployments(workspace=request.workspace).prefetch_related("replicas")
    )
    charged = billing_selectors.replica_charges_micros(workspace=request.workspace)
    now = timezone.now()
    for deployment in deployments:
        deployment.cost_micros = _cost_micros(deployment, charged, now)
        deployment.live_replicas = sum(
            r.status in (ReplicaStatus.STARTING, ReplicaStatus.READY)
            for r in deployment.replicas.all()
        )
    return render(request, "dashboard/deployments.html", {"deployments": deployments})


def _replicas(deployment: Deployment, now) -> list[dict]:
    """The newest replicas, each with how long it served (from ready to stopped, or now)."""
    rows = []
    for replica in deployment.replicas.order_by("-pk")[:20]:
        end = replica.stopped_at or now
        up = (end - replica.ready_at).total_seconds() if replica.ready_at else None
        rows.append({"replica": replica, "uptime": progress.duration(up)})
    return rows


def _deployment_page(request, deployment: Deployment, form: SettingsForm, status: int = 200):
    now = timezone.now()
    charged = billing_selectors.replica_charges_micros(workspace=request.workspace)
    context = {
        "deployment": deployment,
        "catalog_error": errors.CATALOG.get(deployment.error_code),
        "replicas": _replicas(deployment, now),
        "timeline": timeline(selectors.list_events(deployment=deployment)),
        "cost_micros": _cost_micros(deployment, charged, now),
        "form": form,
        "playground": _playground_url(deployment),
    }
    return render(request, "dashboard/deployment.html", context, status=status)


def _playground_query(deployment: Deployment) -> dict[str, str]:
    """The deployment's first adapter beside its base (or the base alone)."""
    model = deployment.adapters[0]["name"] if deployment.adapters else deployment.base_model
    return {"model": model, "baseline": deployment.base_model}


def _playground_url(deployment: Deployment) -> str:
    return f"{reverse('dashboard:playground')}?{urlencode(_playground_query(deployment))}"


@workspace_view
def deployment_detail(request, deployment_id: str):
    deployment = _deployment(request, deployment_id)
    form = SettingsForm(
        initial={
            "min_replicas": deployment.min_replicas,
            "max_replicas": deployment.max_replicas,
            "idle_timeout_seconds": deployment.idle_timeout_seconds,
        }
    )
    return _deployment_page(request, deployment, form)


@workspace_view
def deployment_status(request, deployment_id: str):
    """The deployment's status: its page reloads when it changes from a passing one."""
    return JsonResponse({"status": _deployment(request, deployment_id).status})


@require_POST
@workspace_view
def deployment_settings(request, deployment_id: str):
    deployment = _deployment(request, deployment_id)
    form = SettingsForm(request.POST)
    if form.is_valid():
        try:
            services.update_deployment(
                deployment=deployment, adapters=None, changes=form.cleaned_data
            )
        except VeriError as exc:
            form.add_error(exc.field if exc.field in form.fields else None, exc.message)
        else:
            messages.success(request, f"Saved the settings of {deployment.public_id}.")
            return redirect("dashboard:deployment", deployment_id=deployment.public_id)
    return _deployment_page(request, deployment, form, status=400)


@require_POST
@workspace_view
def deployment_delete(request, deployment_id: str):
    deployment = _deployment(request, deployment_id)
    services.delete_deployment(deployment=deployment)
    messages.success(request, f"Deleted deployment {deployment_id}; its replicas are stopped.")
    return redirect("dashboard:deployments")


@require_POST
@workspace_view
def job_deploy(request, job_id: str):
    """Deploy the job's adapter on the defaults (scale to zero when idle), or go to the
    deployment already serving it."""
    job = workspace_job(request, job_id)
    name = services.deployable_name(job)
    back = reverse("dashboard:job", args=[job.public_id])
    if name is None:
        return _not_deployed(request, f"{job.public_id} has no trained adapter to deploy.", back)
    return deploy_adapter(request, name, back=back)


def deploy_adapter(request, name: str, *, back: str):
    """Deploy the adapter `name` on the defaults (scale to zero when idle), or go to the
    deployment already serving it; a refusal is a page with a link `back`."""
    try:
        deployment = services.create_deployment(
            workspace=request.workspace, base_model=None, adapters=[name], shape=services.Shape()
        )
    except Conflict as exc:  # `already_deployed`: go to the deployment serving it
        messages.info(request, f"{name} is already deployed here.")
        return redirect("dashboard:deployment", deployment_id=exc.extra["deployment_id"])
    except VeriError as exc:
        return _not_deployed(request, exc.message, back)
    messages.success(request, f"Deploying {name}: its first replica is starting.")
    return redirect("dashboard:deployment", deployment_id=deployment.public_id)


def _not_deployed(request, message: str, back: str):
    context = {"title": "Not deployed", "message": message, "back": back}
    return render(request, "dashboard/message.html", context, status=400)


@workspace_view
def playground(request):
    """Two panes, `?model=` and `?baseline=`, each chatting with its model (any name this
    workspace's deployments serve); without them, the newest deployment's first adapter beside
    its base, as its "Open in the playground" link has them."""
    live = [
        d
        for d in selectors.list_deployments(workspace=request.workspace)
        if d.status != DeploymentStatus.FAILED
    ]
    served = sorted({name for d in live for name in d.served_names()})
    asked = request.GET if "model" in request.GET or not live else _playground_query(live[0])
    panes = [
        ("model", asked.get("model", "")[:500], "Model"),
        ("baseline", asked.get("baseline", "")[:500], "Compared with"),
    ]
    context = {"served": served, "panes": panes}
    return render(request, "dashboard/playground.html", context)


def _error(exc: VeriError) -> JsonResponse:
    """In the API's shape: the pane shows the message, and retries `model_starting`."""
    if isinstance(exc, ServiceUnavailable):
        return exc.as_response()  # with Retry-After
    response = JsonResponse(exc.as_body(), status=exc.status)
    for name, value in getattr(exc, "headers", {}).items():  # a rate limit's retry-after
        response[name] = value
    return response


@require_POST
@workspace_view
def playground_chat(request) -> HttpResponse:
    """A chat completion streamed from a replica of `model` (server-sent events, as the API
    streams them): the playground's panes call this with the session, no API key. A cold model
    answers 503 `model_starting` (the router wakes it); the page retries."""
    try:
        body = json.loads(request.body)
    except ValueError:
        body = None
    try:
        if not isinstance(body, dict) or not isinstance(body.get("model"), str):
            raise VeriError("The body is a JSON object with a model's name.", field="model")
        asked = {k: body[k] for k in PLAYGROUND_FIELDS if k in body}
        payload = {"model": body["model"], **asked, "stream": True}
        # The playground's requests count against the workspace's limits, as the API's do.
        limits.admit(workspace=request.workspace, tokens=limits.estimate_tokens(payload))
        held = inference.route(workspace=request.workspace, model=body["model"])
        return inference.forward(
            held=held, path="/v1/chat/completions", body=json.dumps(payload).encode()
        )
    except VeriError as exc:
        return _error(exc)
