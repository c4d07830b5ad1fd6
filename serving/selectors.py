"""Reads of deployments, workspace-scoped."""

from collections.abc import Iterable
from datetime import datetime

from django.db.models import Count, Q, QuerySet

from serving.models import (
    Deployment,
    DeploymentEvent,
    DeploymentStatus,
    Evaluation,
    EvaluationSample,
    Replica,
    ReplicaStatus,
)
from training.models import Dataset
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


def list_evaluations(*, workspace: Workspace) -> QuerySet[Evaluation]:
    """Newest first, each with `sample_count`, `answered_count` (samples both models answered)
    and `scored_count` (samples both answers to are scored: a grader error is no score)."""
    answered = Q(samples__model_output__isnull=False, samples__baseline_output__isnull=False)
    scored = Q(
        samples__model_score__isnull=False,
        samples__baseline_score__isnull=False,
        samples__model_grader_error="",
        samples__baseline_grader_error="",
    )
    return (
        Evaluation.objects.filter(workspace=workspace)
        .annotate(
            sample_count=Count("samples"),
            answered_count=Count("samples", filter=answered),
            scored_count=Count("samples", filter=scored),
        )
        .order_by("-pk")
    )


def get_evaluation(*, workspace: Workspace, evaluation_id: str) -> Evaluation:
    evaluation = list_evaluations(workspace=workspace).filter(public_id=evaluation_id).first()
    if evaluation is None:
        raise NotFound(f"No evaluation {evaluation_id[:60]!r} in this workspace.")
    return evaluation


def list_evaluation_samples(*, evaluation: Evaluation) -> QuerySet[EvaluationSample]:
    return evaluation.samples.order_by("index")


def evaluation_dataset(*, workspace: Workspace, file: str) -> Dataset:
    """The dataset a file names: a dataset id, or an OpenAI `fine-tune` file's id (a dataset
    underneath; read through the relation, as serving sits below the OpenAI app)."""
    by = {"openai_files__public_id": file} if file.startswith("file-") else {"public_id": file}
    dataset = Dataset.objects.filter(workspace=workspace, **by).first()
    if dataset is None:
        raise NotFound(
            f"No dataset or fine-tune file {file[:60]!r} in this workspace.",
            field="file",
        )
    return dataset


def served_models(*, workspace: Workspace) -> dict[str, Deployment]:
    """Every name the workspace's deployments answer to (bases and adapters), but a failed
    one's, each with its newest deployment."""
    served: dict[str, Deployment] = {}
    for deployment in list_deployments(workspace=workspace).exclude(status=DeploymentStatus.FAILED):
        for name in sorted(deployment.served_names()):
            served.setdefault(name, deployment)
    return served
