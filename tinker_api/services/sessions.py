"""Sessions, their models and the operations queued for them: every state change of the Tinker
face. A model's worker is launched by a task once its row commits; whatever ends a model
(its session ending, its worker failing) fails the operations still waiting, so no future the
client polls is left hanging, and terminates its machine.

Money: a model's machine uptime is charged per second at the catalog's price, in windows claimed
with a conditional UPDATE (`charged_until`), at least every VERI_TINKER_CHARGE_SECONDS and when it
ends, never past its session's budget cap. An end the client did not ask for (an idle session,
the cap, a spent balance) saves the model's state first: a save operation queued after the
client's, then the end; a lost machine's uptime since the last save is credited, as the catalog
says."""

import hashlib
import logging
import secrets
from datetime import timedelta

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import F, Q
from django.utils import timezone

from billing import services as billing
from providers import catalog
from providers.base import CapacityError, LaunchSpec, ProviderError
from providers.services import get_adapter
from serving.services.replicas import CPU_ENGINE_PROVIDERS
from tinker_api.models import (
    MODEL_LIVE,
    CheckpointKind,
    ModelStatus,
    OpKind,
    OpStatus,
    TinkerCheckpoint,
    TinkerModel,
    TinkerOperation,
    TinkerSession,
)
from tinker_api.services.base_models import check_base_model
from training import errors
from veri.errors import PaymentRequired, VeriError
from veri.models import Workspace
from veri.money import compute_micros, micros_from_usd, usd
from veri.queue import enqueue_on_commit

log = logging.getLogger(__name__)
TOKEN_PREFIX = "veri_tt_"
LAUNCHING = "launching"  # external_id while a task launches the machine
MACHINE_TAG = "tinker-"
BUDGET_KEY = "veri_max_cost_usd"  # in the client's `user_metadata` on create_session
MAX_BUDGET_MICROS = 10**12  # a million dollars: far below the column's limit


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
        max_cost_micros=session_budget(user_metadata),
    )


def session_budget(user_metadata: dict) -> int:
    """The session's cap: the client's `veri_max_cost_usd` (a positive number of dollars), else
    VERI_TINKER_SESSION_MAX_COST_USD."""
    raw = user_metadata.get(BUDGET_KEY, settings.VERI_TINKER_SESSION_MAX_COST_USD)
    try:
        budget = micros_from_usd(raw)
    except (ArithmeticError, ValueError):
        budget = 0
    if not 0 < budget <= MAX_BUDGET_MICROS:
        raise VeriError(
            f"{BUDGET_KEY} is a positive number of dollars, at most {usd(MAX_BUDGET_MICROS)} "
            f"(got {raw!r}).",
            field="user_metadata",
        )
    return budget


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
    """The session is over: each live model saves its state, then ends (`session_ended`)."""
    with transaction.atomic():
        ended = TinkerSession.objects.filter(pk=session.pk, ended_at__isnull=True).update(
            ended_at=timezone.now()
        )
        if not ended:
            return
        for model in session.models.filter(status__in=MODEL_LIVE):
            save_and_end(model=model, code="session_ended", message=reason)


def save_and_end(*, model: TinkerModel, code: str, message: str) -> None:
    """End a model the client did not stop, its state saved first: a save operation after the
    client's last one (the worker runs them in order), then `finish_saving` ends it with `code`.
    A model with no state to save ends at once: one not ready yet, a sampling-only one, one
    whose state is saved as it is (nothing waits, nothing changed it since its last save)."""
    with transaction.atomic():
        model = TinkerModel.objects.select_for_update().get(pk=model.pk)
        if model.status == ModelStatus.STARTING or model.samples_only:
            end_model(model=model, status=ModelStatus.ENDED, code=code, message=message)
            return
        if model.status != ModelStatus.READY:
            return  # saving already, or over
        if (saved := _saved_as_it_is(model)) is not None:
            end_model(model=model, status=ModelStatus.ENDED, code=code, message=message + saved)
            return
        operation = _save_after_the_clients(model, code)
        name = operation.payload["name"]
        TinkerCheckpoint.objects.create(
            model=model, workspace=model.workspace, operation=operation, name=name
        )
        TinkerModel.objects.filter(pk=model.pk).update(
            status=ModelStatus.SAVING,
            error_code=code,
            error_message=f"{message} Its state is being saved as "
            f"tinker://{model.model_id}/weights/{name}.",
        )


# What changes a model's state (its LoRA weights, its optimizer's).
CHANGES_STATE = (OpKind.CREATE, OpKind.OPTIM_STEP, OpKind.LOAD_WEIGHTS)


def _saved_as_it_is(model: TinkerModel) -> str | None:
    """When nothing waits and nothing changed its state since it was last saved or loaded (or
    ever), what the end's message says of it (" Its state is saved as …"); else None: save it."""
    operations = model.operations.exclude(kind=OpKind.SAMPLE)
    if operations.filter(status__in=(OpStatus.QUEUED, OpStatus.RUNNING)).exists():
        return None
    changed = (
        operations.filter(kind__in=CHANGES_STATE, status=OpStatus.DONE).order_by("-seq_id").first()
    )
    if changed is None:
        return None
    if changed.kind == OpKind.CREATE and not changed.payload.get("load"):
        return " Nothing trained it, so nothing was saved."
    loaded = (changed.payload.get("load") or changed.payload).get("path")
    if changed.kind != OpKind.OPTIM_STEP and loaded:
        return f" Its state is still the one it loaded, {loaded}."
    saved = (
        TinkerCheckpoint.objects.filter(
            model=model,
            kind=CheckpointKind.STATE,
            files__isnull=False,
            operation__seq_id__gt=changed.seq_id,
        )
        .order_by("-operation__seq_id")
        .first()
    )
    if saved is None:
        return None
    return f" Its state is saved as tinker://{model.model_id}/weights/{saved.name}."


def _save_after_the_clients(model: TinkerModel, code: str) -> TinkerOperation:
    """A save numbered after the client's last request; a request the client sends with that
    number at the same moment wins it, and the save takes the next."""
    while True:
        last = model.operations.order_by("-seq_id").values_list("seq_id", flat=True).first()
        seq_id = (last or 0) + 1
        try:
            with transaction.atomic():
                return TinkerOperation.objects.create(
                    model=model,
                    seq_id=seq_id,
                    kind=OpKind.SAVE_WEIGHTS,
                    payload={"name": f"{code}-{seq_id}", "then_end": True},
                )
        except IntegrityError:
            continue


def finish_saving(*, model: TinkerModel, saved: bool) -> None:
    """Its end's save is done (`saved`), failed or never came: the model ends with the code it
    was ending with, its message saying whether its state can be loaded."""
    model.refresh_from_db()
    if model.status != ModelStatus.SAVING:
        return
    outcome = "Its state is saved as" if saved else "Its state could not be saved as"
    message = model.error_message.replace("Its state is being saved as", outcome)
    end_model(model=model, status=ModelStatus.ENDED, code=model.error_code, message=message)


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
    billing.require_tinker_funds(workspace=session.workspace)
    if session_spent_micros(session) >= session.max_cost_micros:
        raise PaymentRequired(
            f"This session spent its budget cap ({usd(session.max_cost_micros)} USD); start a "
            f"new ServiceClient with a higher {BUDGET_KEY} in user_metadata.",
            code="budget_exhausted",
        )
    gpu = catalog.get_provider(settings.VERI_TINKER_PROVIDER).gpu(settings.VERI_TINKER_GPU_TYPE)
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
                "price_per_hour_micros": gpu.price_per_gpu_hour_micros,
            },
        )
        operation, _ = TinkerOperation.objects.get_or_create(
            model=model, seq_id=0, defaults={"kind": OpKind.CREATE, "payload": {"load": load}}
        )
        if created:
            enqueue_on_commit("tinker_api.tasks.launch_model", model_pk=model.pk)
    return operation


def samples_on_vllm(model: TinkerModel) -> bool:
    """Whether the model's worker samples with vLLM: on a GPU machine, as a deployment's replica
    serves (the local provider's CPU samples with transformers), unless its LoRA covers the LM
    head (`train_unembed`, Tinker's default), which vLLM cannot load ("lm_head… is unsupported
    LoRA weight"): such a model samples with transformers on its GPU."""
    trains_unembed = model.lora.get("train_unembed", True)
    return model.provider not in CPU_ENGINE_PROVIDERS and not trains_unembed


def worker_command(*, model: TinkerModel, api: str) -> tuple[str, ...]:
    """The model's `python -m worker …` command."""
    command = ("tinker", "--model", model.model_id, "--api", api)
    return (*command, "--sampler", "vllm") if samples_on_vllm(model) else command


def launch_model(*, model_pk: int) -> str:
    """Launch the model's worker (the task's body; a second run finds it claimed): on the local
    provider a process here, on a cloud one a machine whose bootstrap (providers/bootstrap.py)
    installs the worker (and vLLM, its sampler there) and runs `python -m worker tinker` with the
    model's token, tried in each zone of the region in turn while the provider has no capacity."""
    claimed = TinkerModel.objects.filter(
        pk=model_pk, status=ModelStatus.STARTING, external_id=""
    ).update(external_id=LAUNCHING)
    if not claimed:
        return "not claimed"
    model = TinkerModel.objects.get(pk=model_pk)
    token = mint_token(model=model)
    region = settings.VERI_DEFAULT_REGION
    api = settings.VERI_PUBLIC_URL
    adapter = get_adapter(model.provider)
    problems = []
    for zone in catalog.get_provider(model.provider).zones.get(region, ()):
        spec = LaunchSpec(
            job_id=machine_tag(model.pk),
            region=region,
            zone=zone,
            gpu_type=model.gpu_type,
            gpu_count=1,
            api_url=api,
            env={"VERI_TINKER_TOKEN": token, "VERI_API_URL": api},
            worker_args=worker_command(model=model, api=api),
            kind="tinker_models",
            route_id=model.model_id,
            engine_requirement=settings.VERI_VLLM_REQUIREMENT if samples_on_vllm(model) else "",
        )
        try:
            external_id = adapter.launch(spec)
        except CapacityError as exc:  # none in this zone: the next may have one
            problems.append(str(exc))
            continue
        except ProviderError as exc:
            problems.append(str(exc))
            break
        TinkerModel.objects.filter(pk=model.pk).update(
            external_id=external_id, launched_at=timezone.now()
        )
        return "launched"
    TinkerModel.objects.filter(pk=model.pk).update(external_id="")
    message = "; ".join(problems) or f"{model.provider} has no zone in {region}"
    end_model(model=model, status=ModelStatus.FAILED, code="provisioning_error", message=message)
    return "provisioning_error"


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
    futures raise it), its uptime is charged to its end (and credited back from its last save
    when the catalog credits `code`), its machine is terminated once this commits."""
    now = timezone.now()
    with transaction.atomic():
        changed = TinkerModel.objects.filter(pk=model.pk, status__in=MODEL_LIVE).update(
            status=status, error_code=code, error_message=message[:4000], ended_at=now
        )
        if not changed:
            return
        model.refresh_from_db()
        charge_uptime(model=model, until=now)
        model.refresh_from_db(fields=["charged_micros", "charged_until"])
        credit_lost_uptime(model=model)
        customer = (
            code in errors.CATALOG and errors.get(code).attribution == errors.Attribution.CUSTOMER
        )
        category = "user" if customer else "server"
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
    again (a retried request) is the same operation. Once the model is saving to end, what the
    client sends after the end's save fails with the end's code."""
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
    if not created and operation.payload.get("then_end"):
        model.refresh_from_db(fields=["error_code", "error_message"])
        raise VeriError(model.error_message, code=model.error_code)
    if created and _after_the_end(model, seq_id):
        TinkerOperation.objects.filter(pk=operation.pk).update(
            status=OpStatus.FAILED,
            error=f"{model.error_code}: {model.error_message}",
            error_category="user" if model.status == ModelStatus.ENDED else "server",
            finished_at=timezone.now(),
        )
    return operation


def _after_the_end(model: TinkerModel, seq_id: int) -> bool:
    model.refresh_from_db(fields=["status", "error_code", "error_message"])
    if model.status == ModelStatus.SAVING:
        return model.operations.filter(payload__then_end=True, seq_id__lt=seq_id).exists()
    return model.status not in MODEL_LIVE


# Money


def accrued_micros(*, model: TinkerModel, until) -> int:
    """The model's uptime not charged yet, up to `until`."""
    start = model.charged_until or model.launched_at
    if start is None or until <= start:
        return 0
    return compute_micros(price_per_hour_micros=model.price_per_hour_micros, start=start, end=until)


def session_spent_micros(session: TinkerSession) -> int:
    return sum(session.models.values_list("charged_micros", flat=True))


def charge_uptime(*, model: TinkerModel, until) -> int:
    """Charge the model's uptime since its last charge (or its launch) up to `until`, per
    second, never past its session's cap; what was charged. The window is claimed with a
    conditional UPDATE in the charge's transaction, so two runs never charge it twice; nothing
    past its end. Reaching the cap saves and ends the session's models (`budget_exhausted`)."""
    if model.ended_at is not None:
        until = min(until, model.ended_at)
    start = model.charged_until or model.launched_at
    if start is None or until <= start:
        return 0
    session = model.session
    with transaction.atomic():
        # The session's row serializes its models' charges against the one cap.
        TinkerSession.objects.select_for_update().filter(pk=session.pk).first()
        left = max(session.max_cost_micros - session_spent_micros(session), 0)
        accrued = accrued_micros(model=model, until=until)
        amount = min(accrued, left)
        claimed = TinkerModel.objects.filter(pk=model.pk, charged_until=model.charged_until).update(
            charged_until=until, charged_micros=F("charged_micros") + amount
        )
        if not claimed:
            return 0
        if amount:
            seconds = int((until - start).total_seconds())
            billing.charge_tinker_uptime(
                workspace=model.workspace,
                amount_micros=amount,
                key=f"tinker_charge:{model.model_id}:{start.isoformat()}",
                description=f"Tinker model {model.model_id}: {seconds} s on {model.gpu_type}"
                + (" (capped at the session's budget)" if amount < accrued else ""),
            )
        if amount == left:
            for live in session.models.filter(status__in=MODEL_LIVE):
                save_and_end(
                    model=live,
                    code="budget_exhausted",
                    message=f"The session reached its budget cap of "
                    f"{usd(session.max_cost_micros)} USD.",
                )
    return amount


def credit_lost_uptime(*, model: TinkerModel) -> int:
    """A model ended by a code the catalog credits (`worker_lost`): its uptime since its last
    save (or its launch), which the client cannot get back, credited once."""
    if not model.error_code or errors.get(model.error_code).billing != errors.Billing.REFUND:
        return 0
    saved = (
        model.operations.filter(kind=OpKind.SAVE_WEIGHTS, status=OpStatus.DONE)
        .order_by("-finished_at")
        .values_list("finished_at", flat=True)
        .first()
    )
    since = max(filter(None, (saved, model.launched_at)), default=None)
    if since is None or model.ended_at is None:
        return 0
    lost = compute_micros(
        price_per_hour_micros=model.price_per_hour_micros, start=since, end=model.ended_at
    )
    amount = min(lost, model.charged_micros)
    if amount > 0:
        billing.credit_lost_uptime(
            workspace=model.workspace,
            amount_micros=amount,
            key=f"tinker_lost:{model.model_id}",
            description=f"Tinker model {model.model_id}: {model.error_code}, uptime since "
            f"{'its last save' if saved else 'its launch'}",
        )
    return amount


def end_unstarted(*, now) -> None:
    """A machine whose worker never asked for its model within VERI_PROVISIONING_TIMEOUT_SECONDS
    of the launch (a rented machine's bootstrap stuck, or its worker unable to call back): the
    model ends as the platform's `provisioning_timeout`, its uptime credited, its machine
    terminated, rather than billing while the client waits."""
    limit = settings.VERI_PROVISIONING_TIMEOUT_SECONDS
    for model in TinkerModel.objects.filter(
        status=ModelStatus.STARTING,
        last_seen_at__isnull=True,
        launched_at__lt=now - timedelta(seconds=limit),
    ):
        end_model(
            model=model,
            status=ModelStatus.FAILED,
            code="provisioning_timeout",
            message=f"The model's worker did not start within {limit} s of its machine's launch.",
        )


def sweep(*, now=None) -> None:
    """The periodic task's body: charge running models that are due, end the models of spent
    workspaces and idle sessions (their state saved), end models whose machine is gone (without
    a client polling to notice), whose worker never started, or whose end's save never
    finished."""
    now = now or timezone.now()
    due = now - timedelta(seconds=settings.VERI_TINKER_CHARGE_SECONDS)
    live = TinkerModel.objects.filter(status__in=MODEL_LIVE, launched_at__isnull=False)
    for model in live.filter(
        Q(charged_until__lte=due) | Q(charged_until__isnull=True, launched_at__lte=due)
    ).select_related("session", "workspace"):
        charge_uptime(model=model, until=now)
    for workspace in Workspace.objects.filter(pk__in=live.values("workspace_id")):
        if billing.balance_micros(workspace=workspace) <= 0:
            for model in live.filter(workspace=workspace):
                save_and_end(
                    model=model,
                    code="balance_exhausted",
                    message=f"The workspace's balance ran out. {billing.credit_hint()} to go on.",
                )
    open_sessions = TinkerSession.objects.filter(ended_at__isnull=True)
    for session in open_sessions.filter(models__status__in=MODEL_LIVE).distinct():
        if session_idle(session):
            end_session(session=session, reason="The session had no heartbeat for too long.")
    end_unstarted(now=now)
    stalled = now - timedelta(seconds=settings.VERI_TINKER_SAVE_TIMEOUT_SECONDS)
    for model in TinkerModel.objects.filter(status__in=MODEL_LIVE):
        check_machine(model=model)
        saving = model.operations.filter(payload__then_end=True, created_at__lt=stalled)
        if model.status == ModelStatus.SAVING and saving.exists():
            finish_saving(model=model, saved=False)
