"""Reads of the Tinker face, always within the caller's workspace: another workspace's session,
model or future is simply not found."""

import re
import time

from django.conf import settings
from django.db.models import Count, Prefetch, QuerySet, Sum
from django.db.models.functions import Coalesce

from billing.selectors import list_ledger
from tinker_api.models import (
    OpStatus,
    TinkerCheckpoint,
    TinkerKey,
    TinkerModel,
    TinkerOperation,
    TinkerSession,
)
from veri.errors import NotFound
from veri.models import Workspace

FINISHED = (OpStatus.DONE, OpStatus.FAILED)


def get_session(*, workspace: Workspace, session_id: str) -> TinkerSession:
    session = TinkerSession.objects.filter(workspace=workspace, public_id=session_id).first()
    if session is None:
        raise NotFound(f"No session {session_id} in this workspace.")
    return session


def get_model(*, workspace: Workspace, model_id: str) -> TinkerModel:
    model = TinkerModel.objects.filter(workspace=workspace, model_id=model_id).first()
    if model is None:
        raise NotFound(f"No model {model_id} in this workspace.")
    return model


def get_operation(*, workspace: Workspace, request_id: str) -> TinkerOperation:
    operation = (
        TinkerOperation.objects.filter(model__workspace=workspace, request_id=request_id)
        .select_related("model")
        .first()
    )
    if operation is None:
        raise NotFound(f"No request {request_id} in this workspace.")
    return operation


def wait_finished(*, operation: TinkerOperation, wait: float) -> TinkerOperation:
    """The operation once done or failed, or as it is after `wait` seconds (a long poll: the
    client asks again at once when told to try again)."""
    deadline = time.monotonic() + wait
    while operation.status not in FINISHED and time.monotonic() < deadline:
        time.sleep(settings.VERI_TINKER_POLL_INTERVAL_SECONDS)
        operation.refresh_from_db(fields=["status", "result", "error", "error_category"])
    return operation


def list_keys(*, workspace: Workspace):
    return TinkerKey.objects.filter(workspace=workspace).order_by("-created_at", "-pk")


def get_key(*, workspace: Workspace, key_id: str) -> TinkerKey:
    key = list_keys(workspace=workspace).filter(public_id=key_id).first()
    if key is None:
        raise NotFound(f"No Tinker key {key_id} in this workspace.")
    return key


def list_models(*, workspace: Workspace) -> QuerySet[TinkerModel]:
    """The workspace's models (the client's training runs), newest first, each with its
    `operation_count` and the input `tokens` of its forward(_backward)s."""
    return (
        TinkerModel.objects.filter(workspace=workspace)
        .annotate(
            operation_count=Count("operations"), tokens=Coalesce(Sum("operations__tokens"), 0)
        )
        .order_by("-created_at", "-pk")
    )


def list_checkpoints(*, workspace: Workspace) -> QuerySet[TinkerCheckpoint]:
    """Saved checkpoints (all files uploaded), newest first."""
    return (
        TinkerCheckpoint.objects.filter(workspace=workspace, files__isnull=False)
        .select_related("model", "workspace", "checkpoint", "operation")
        .order_by("-created_at", "-pk")
    )


def get_checkpoint(*, workspace: Workspace, model_id: str, checkpoint_id: str) -> TinkerCheckpoint:
    """The client's `<model_id>` and `<kind>/<name>` (`weights/…`, `sampler_weights/…`), or the
    dashboard's public id (`tck_…`)."""
    kind, _, name = checkpoint_id.partition("/")
    found = list_checkpoints(workspace=workspace).filter(model__model_id=model_id)
    by = {"kind": kind, "name": name} if name else {"public_id": checkpoint_id}
    checkpoint = found.filter(**by).first()
    if checkpoint is None:
        raise NotFound(f"No checkpoint {checkpoint_id} of {model_id} in this workspace.")
    return checkpoint


def list_sessions(*, workspace: Workspace) -> QuerySet[TinkerSession]:
    """Sessions newest first, with their models (as `list_models` counts them) and each model's
    saved checkpoints."""
    models = list_models(workspace=workspace).order_by("model_seq_id")
    saved = TinkerCheckpoint.objects.filter(files__isnull=False).order_by("created_at", "pk")
    return (
        TinkerSession.objects.filter(workspace=workspace)
        .prefetch_related(
            Prefetch("models", queryset=models), Prefetch("models__checkpoints", queryset=saved)
        )
        .order_by("-created_at", "-pk")
    )


def model_costs_micros(*, workspace: Workspace, model_ids: list[str]) -> dict[str, int]:
    """What each model was charged (positive micros), for those charged: ledger entries whose
    idempotency key names the model id as one of its `:`-separated parts (`…:<model_id>:…`)."""
    costs: dict[str, int] = {}
    if not model_ids:
        return costs
    named = re.compile(r"(?:^|:)(" + "|".join(re.escape(m) for m in model_ids) + r")(?::|$)")
    entries = list_ledger(workspace=workspace).filter(idempotency_key__contains=":train:")
    for key, amount in entries.values_list("idempotency_key", "amount_micros"):
        if match := named.search(key):
            costs[match.group(1)] = costs.get(match.group(1), 0) - amount
    return costs
