"""Sessions, their models and the operations queued for them: every state change of the Tinker
face. A model's worker is launched by a task once its row commits; whatever ends a model
(its session ending, its worker failing) fails the operations still waiting, so no future the
client polls is left hanging, and terminates its machine."""

import hashlib
import logging
import secrets
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from providers import catalog
from providers.base import LaunchSpec, ProviderError
from providers.services import get_adapter
from tinker_api.models import (
    MODEL_LIVE,
    ModelStatus,
    OpKind,
    OpStatus,
    TinkerModel,
    TinkerOperation,
    TinkerSession,
)
from tinker_api.services.base_models import check_base_model
from veri.errors import VeriError
from veri.models import Workspace
from veri.queue import enqueue_on_commit

log = logging.getLogger(__name__)
TOKEN_PREFIX = "veri_tt_"
LAUNCHING = "launching"  # external_id while a task launches the machine
MACHINE_TAG = "tinker-"


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def create_session(
    *, workspace: Workspace, sdk_version: str, tags: list[str], user_metadata: dict
) -> TinkerSession:
    return TinkerSession.objects.create(
        workspace=workspace,
        sdk_version=sdk_version[:40],
        tags=tags,
        user_metadata=user_metadata,
        last_heartbeat_at=timezone.now(),
    )


def session_idle(session: TinkerSession) -> bool:
    """No heartbeat for VERI_TINKER_SESSION_TIMEOUT_SECONDS (the client sends one every 10 s)."""
    limit = timedelta(seconds=settings.VERI_TINKER_SESSION_TIMEOUT_SECONDS)
    return timezone.now() - session.last_heartbeat_at > limit


def heartbeat(*, session: TinkerSession) -> bool:
    """Keep the session alive; False when it has ended (the client then stops heartbeating)."""
    if session.ended_at is None and session_idle(session):
        end_session(session=session, reason="The session had no heartbeat for too long.")
    return bool(
        TinkerSession.objects.filter(pk=session.pk, ended_at__isnull=True).update(
            last_heartbeat_at=timezone.now()
        )
    )


def end_session(*, session: TinkerSession, reason: str) -> None:
    with transaction.atomic():
        ended = TinkerSession.objects.filter(pk=session.pk, ended_at__isnull=True).update(
            ended_at=timezone.now()
        )
        if not ended:
            return
        for model in session.models.filter(status__in=MODEL_LIVE):
            end_model(model=model, status=ModelStatus.ENDED, code="session_ended", message=reason)


def create_model(
    *,
    session: TinkerSession,
    model_seq_id: int,
    base_model: str,
    lora: dict,
    user_metadata: dict,
    load: dict | None = None,
) -> TinkerOperation:
    """The model's creation, as an operation its worker answers once the model is loaded (and
    `load`'s checkpoint loaded into it: the client's create-from-state); the same `model_seq_id`
    again (a retried request) is the same model."""
    if session.ended_at is not None:
        raise VeriError("This session has ended; start a new ServiceClient.", code="session_ended")
    model_id = f"{session.public_id}:train:{model_seq_id}"
    existing = TinkerModel.objects.filter(model_id=model_id).first()
    if existing is not None:
        return existing.operations.get(seq_id=0)
    check_base_model(workspace=session.workspace, base_model=base_model)
    with transaction.atomic():
        model, created = TinkerModel.objects.get_or_create(
            model_id=model_id,
            defaults={
                "session": session,
                "workspace": session.workspace,
                "model_seq_id": model_seq_id,
                "base_model": base_model,
                "lora": lora,
                "user_metadata": user_metadata,
                "provider": settings.VERI_TINKER_PROVIDER,
                "gpu_type": settings.VERI_TINKER_GPU_TYPE,
            },
        )
        operation, _ = TinkerOperation.objects.get_or_create(
            model=model, seq_id=0, defaults={"kind": OpKind.CREATE, "payload": {"load": load}}
        )
        if created:
            enqueue_on_commit("tinker_api.tasks.launch_model", model_pk=model.pk)
    return operation


def launch_model(*, model_pk: int) -> str:
    """Launch the model's worker (the task's body; a second run finds it claimed)."""
    claimed = TinkerModel.objects.filter(
        pk=model_pk, status=ModelStatus.STARTING, external_id=""
    ).update(external_id=LAUNCHING)
    if not claimed:
        return "not claimed"
    model = TinkerModel.objects.get(pk=model_pk)
    token = mint_token(model=model)
    region = settings.VERI_DEFAULT_REGION
    api = settings.VERI_PUBLIC_URL
    spec = LaunchSpec(
        job_id=machine_tag(model.pk),
        region=region,
        zone=catalog.get_provider(model.provider).zones[region][0],
        gpu_type=model.gpu_type,
        gpu_count=1,
        api_url=api,
        env={"VERI_TINKER_TOKEN": token, "VERI_API_URL": api},
        worker_args=("tinker", "--model", model.model_id, "--api", api),
    )
    try:
        external_id = get_adapter(model.provider).launch(spec)
    except ProviderError as exc:
        TinkerModel.objects.filter(pk=model.pk).update(external_id="")
        end_model(
            model=model, status=ModelStatus.FAILED, code="provisioning_error", message=str(exc)
        )
        return "provisioning_error"
    TinkerModel.objects.filter(pk=model.pk).update(external_id=external_id)
    return "launched"


def mint_token(*, model: TinkerModel) -> str:
    """The model's worker token (only its hash is kept); an earlier one dies."""
    token = f"{TOKEN_PREFIX}{secrets.token_hex(32)}"
    TinkerModel.objects.filter(pk=model.pk).update(token_hash=token_hash(token))
    return token


def machine_tag(model_pk: int) -> str:
    """What a model's machine is tagged with (the local provider's folder name)."""
    return f"{MACHINE_TAG}{model_pk}"


def live_machines(tagged: set[str]) -> dict[str, str | None]:
    """Training's orphan sweeper asks: of the tagged ids, the live models with their machines
    (a machine of an ended model is swept)."""
    pks = {
        int(tag.removeprefix(MACHINE_TAG)): tag
        for tag in tagged
        if tag.startswith(MACHINE_TAG) and tag.removeprefix(MACHINE_TAG).isdigit()
    }
    rows = TinkerModel.objects.filter(pk__in=pks, status__in=MODEL_LIVE)
    return {
        pks[pk]: (None if external in ("", LAUNCHING) else external)
        for pk, external in rows.values_list("pk", "external_id")
    }


def end_model(*, model: TinkerModel, status: str, code: str, message: str) -> None:
    """The model stops for good: the operations still waiting fail with `message` (the client's
    futures raise it), its machine is terminated once this commits."""
    with transaction.atomic():
        changed = TinkerModel.objects.filter(pk=model.pk, status__in=MODEL_LIVE).update(
            status=status, error_code=code, error_message=message[:4000], ended_at=timezone.now()
        )
        if not changed:
            return
        category = "user" if code == "session_ended" else "server"
        model.operations.filter(status__in=(OpStatus.QUEUED, OpStatus.RUNNING)).update(
            status=OpStatus.FAILED,
            error=f"{code}: {message}",
            error_category=category,
            finished_at=timezone.now(),
        )
        enqueue_on_commit("tinker_api.tasks.stop_machine", model_pk=model.pk)


def check_machine(*, model: TinkerModel) -> None:
    """A live model whose machine is gone ends (`worker_lost`), failing what waits for it."""
    if model.status not in MODEL_LIVE or model.external_id in ("", LAUNCHING):
        return
    try:
        state = get_adapter(model.provider).states([model.external_id]).get(model.external_id)
    except ProviderError:  # the provider did not answer: ask again on the next poll
        return
    if state is not None and not state.alive:
        end_model(
            model=model,
            status=ModelStatus.FAILED,
            code="worker_lost",
            message="The model's machine is gone; its state since the last save is lost.",
        )


def stop_machine(*, model_pk: int) -> None:
    model = TinkerModel.objects.get(pk=model_pk)
    if model.external_id and model.external_id != LAUNCHING:
        try:
            get_adapter(model.provider).terminate(model.external_id)
        except ProviderError:  # the provider's own sweep finds it
            log.warning("could not terminate tinker model %s", model.model_id, exc_info=True)


def enqueue(*, model: TinkerModel, seq_id: int, kind: str, payload: dict) -> TinkerOperation:
    """Queue one operation for the model's worker, in the client's order; the same `seq_id`
    again (a retried request) is the same operation."""
    if seq_id < 1:
        raise VeriError("seq_id starts at 1 (0 is the model's creation).", field="seq_id")
    if kind == OpKind.SAMPLE:  # many per seq_id: the sampler's save (tinker_api.models)
        operation, created = (
            TinkerOperation.objects.create(model=model, seq_id=seq_id, kind=kind, payload=payload),
            True,
        )
    else:
        ordered = TinkerOperation.objects.exclude(kind=OpKind.SAMPLE)
        operation, created = ordered.get_or_create(
            model=model, seq_id=seq_id, defaults={"kind": kind, "payload": payload}
        )
    if created and model.status not in MODEL_LIVE:
        TinkerOperation.objects.filter(pk=operation.pk).update(
            status=OpStatus.FAILED,
            error=f"{model.error_code}: {model.error_message}",
            error_category="user" if model.status == ModelStatus.ENDED else "server",
            finished_at=timezone.now(),
        )
    return operation
