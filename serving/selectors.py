"""Reads of deployments, workspace-scoped."""

from django.db.models import QuerySet

from serving.models import Deployment, DeploymentEvent, DeploymentStatus
from veri.errors import NotFound
from veri.models import Workspace


def list_deployments(*, workspace: Workspace) -> QuerySet[Deployment]:
    return Deployment.objects.filter(workspace=workspace).order_by("-pk")


def get_deployment(*, workspace: Workspace, deployment_id: str) -> Deployment:
    deployment = list_deployments(workspace=workspace).filter(public_id=deployment_id).first()
    if deployment is None:
        raise NotFound(f"No deployment {deployment_id[:60]!r} in this workspace.")
    return deployment


def list_events(*, deployment: Deployment) -> QuerySet[DeploymentEvent]:
    return deployment.events.order_by("pk")


def serving(*, workspace: Workspace, model: str) -> Deployment | None:
    """The workspace's deployment that serves `model` (an adapter's name or its base), newest
    first, a failed one last."""
    found = [d for d in list_deployments(workspace=workspace) if model in d.served_names()]
    found.sort(key=lambda d: d.status == DeploymentStatus.FAILED)
    return found[0] if found else None


def served_models(*, workspace: Workspace) -> dict[str, Deployment]:
    """Every name the workspace's deployments answer to (bases and adapters), but a failed
    one's, each with its newest deployment."""
    served: dict[str, Deployment] = {}
    for deployment in list_deployments(workspace=workspace).exclude(status=DeploymentStatus.FAILED):
        for name in sorted(deployment.served_names()):
            served.setdefault(name, deployment)
    return served
