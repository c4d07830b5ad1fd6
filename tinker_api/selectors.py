"""Reads of the Tinker face, always within the caller's workspace: another workspace's session,
model or future is simply not found."""

import time

from django.conf import settings

from tinker_api.models import OpStatus, TinkerKey, TinkerModel, TinkerOperation, TinkerSession
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
