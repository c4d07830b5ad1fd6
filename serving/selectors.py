"""Reads of deployments, workspace-scoped."""

from collections.abc import Iterable
from datetime import datetime

from django.db.models import QuerySet

from serving.models import Deployment, DeploymentEvent, DeploymentStatus, Replica, ReplicaStatus
from veri.errors import NotFound
from veri.models import Workspace
from veri.money import compute_micros


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


def ready_replica(*, deployment: Deployment) -> Replica | None:
    return (
        deployment.replicas.filter(status=ReplicaStatus.READY)
        .exclude(url="")
        .order_by("?")  # spread requests over the ready replicas
        .first()
    )


def uncharged_micros(*, replicas: Iterable[Replica], now: datetime) -> int:
    """What the ready ones of a deployment's `replicas` have run up since each was last charged
    (the ledger has the rest): a running deployment's cost so far is both."""
    return sum(
        compute_micros(
            price_per_hour_micros=r.price_per_hour_micros,
            start=r.charged_until or r.ready_at,
            end=now,
        )
        for r in replicas
        if r.status == ReplicaStatus.READY and r.ready_at
    )
