"""A model's worker, seen from the control plane: its token (good for its own model only, dead
once the model ends), its spec, the next operation in order, the results it posts. What it sends
is hostile: a result is kept only for an operation of its own model that is running, and is
checked for the shape the client will read."""

import hmac
import time

from django.conf import settings
from django.core.exceptions import ObjectDoesNotExist
from django.db import transaction
from django.utils import timezone

from tinker_api.models import (
    MODEL_LIVE,
    ModelStatus,
    OpKind,
    OpStatus,
    TinkerModel,
    TinkerOperation,
)
from tinker_api.services import checkpoints, sessions
from tinker_api.services.base_models import base_model_spec
from veri.errors import NotFound, VeriError

REPORTABLE_CODES = {"model_load_error"}  # what a worker may say of itself
# What a rented machine's bootstrap says before the model is ready (it could not install the
# worker): the platform's fault. Believed only then; no customer code ever runs on the machine.
STARTING_CODES = {"provisioning_error"}


def authenticate(*, model_id: str, raw: str) -> TinkerModel | None:
    model = (
        TinkerModel.objects.filter(model_id=model_id, status__in=MODEL_LIVE)
        .exclude(token_hash="")
        .select_related("session", "workspace")
        .first()
    )
    if model is None or not hmac.compare_digest(model.token_hash, sessions.token_hash(raw)):
        return None
    return model


def spec(*, model: TinkerModel) -> dict:
    """What the worker loads, asked once it runs: from then on the model has a worker (seen)."""
    _seen(model)
    return {
        "model_id": model.model_id,
        "base_model": base_model_spec(workspace=model.workspace, base_model=model.base_model),
        "lora": model.lora,
    }


def _seen(model: TinkerModel) -> None:
    TinkerModel.objects.filter(pk=model.pk).update(last_seen_at=timezone.now())


def next_operation(*, model: TinkerModel, after: int, wait: float) -> TinkerOperation | None:
    """The operation after `after` in the client's order, once it is there (waiting up to `wait`
    seconds); it is marked running. None: nothing yet. Raises `ModelEnded` when the model is
    over (its session idle or ended), which tells the worker to exit."""
    deadline = time.monotonic() + wait
    while True:
        _seen(model)
        try:
            model.refresh_from_db(fields=["status"])
            model.session.refresh_from_db(fields=["ended_at", "last_heartbeat_at"])
        except ObjectDoesNotExist:  # deleted during the long poll (its workspace was)
            raise ModelEnded("The model no longer exists.") from None
        if model.status in MODEL_LIVE and sessions.session_idle(model.session):
            sessions.end_session(session=model.session, reason="The session had no heartbeat.")
            model.refresh_from_db(fields=["status"])
        if model.status not in MODEL_LIVE:
            raise ModelEnded(f"The model is {model.status}.")
        wanted = TinkerOperation.objects.filter(
            model=model, seq_id=after + 1, status__in=(OpStatus.QUEUED, OpStatus.RUNNING)
        ).exclude(kind=OpKind.SAMPLE)
        if wanted.filter(status=OpStatus.QUEUED).update(status=OpStatus.RUNNING) or (
            after == -1 and wanted.exists()  # the creation, again after a worker restart
        ):
            return wanted.get()
        if sample := _claim_sample(model, after):
            return sample
        if time.monotonic() >= deadline:
            return None
        time.sleep(settings.VERI_TINKER_POLL_INTERVAL_SECONDS)


def _claim_sample(model: TinkerModel, after: int) -> TinkerOperation | None:
    """A queued sample whose sampler's save the worker has run (its seq_id is at most `after`),
    marked running; samples run between the ordered operations, oldest first."""
    samples = TinkerOperation.objects.filter(
        model=model, kind=OpKind.SAMPLE, status=OpStatus.QUEUED, seq_id__lte=after
    )
    for pk in samples.order_by("pk").values_list("pk", flat=True)[:5]:
        if TinkerOperation.objects.filter(pk=pk, status=OpStatus.QUEUED).update(
            status=OpStatus.RUNNING
        ):
            return TinkerOperation.objects.get(pk=pk)
    return None


class ModelEnded(VeriError):
    status, code = 410, "model_ended"


def finish_operation(
    *, model: TinkerModel, request_id: str, ok: bool, result: dict | None, error: str = ""
) -> None:
    with transaction.atomic():
        operation = (
            TinkerOperation.objects.select_for_update()
            .filter(model=model, request_id=request_id)
            .first()
        )
        if operation is None:
            raise NotFound(f"No operation {request_id} for this model.")
        if operation.status != OpStatus.RUNNING:
            return  # a duplicate report, or the model ended meanwhile
        if ok and operation.uploads:  # a named sampler save's path samples from its files
            result = checkpoints.complete(operation=operation, files=result["files"])
        operation.status = OpStatus.DONE if ok else OpStatus.FAILED
        operation.result = result if ok else None
        # A worker reports only errors of the customer's request (bad inputs); its own faults
        # end the model through report_failure.
        operation.error, operation.error_category = ("", "") if ok else (error[:4000], "user")
        operation.finished_at = timezone.now()
        operation.save()
        if ok and operation.seq_id == 0:
            TinkerModel.objects.filter(pk=model.pk, status=ModelStatus.STARTING).update(
                status=ModelStatus.READY, ready_at=timezone.now()
            )
    if operation.payload.get("then_end"):  # the save before an end the client did not ask for
        sessions.finish_saving(model=model, saved=ok)


def report_failure(*, model: TinkerModel, code: str, message: str) -> None:
    starting = model.status == ModelStatus.STARTING and code in STARTING_CODES
    if code not in REPORTABLE_CODES and not starting:
        code = "worker_failed"
    sessions.end_model(model=model, status=ModelStatus.FAILED, code=code, message=message)
