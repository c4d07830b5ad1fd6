"""A deployment's replicas: launched through its provider, registered and heartbeating with a
replica token (as a job's worker does with its job token), stopped with their machine always
terminated."""

import hashlib
import hmac
import logging
import secrets
from datetime import datetime, timedelta
from urllib.parse import urlsplit

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from providers import catalog
from providers.base import LaunchSpec, ProviderError
from providers.services import get_adapter, machine_states
from serving import hooks
from serving.models import REPLICA_LIVE, Deployment, DeploymentStatus, Replica, ReplicaStatus
from serving.services import states
from training import errors
from training.models import Checkpoint
from training.services.worker import checkpoint_spec
from veri.errors import VeriError
from veri.money import compute_micros
from veri.queue import enqueue_on_commit
from volumes import selectors as volume_selectors
from volumes.models import byte_range
from volumes.stores import store_for

log = logging.getLogger(__name__)
S, R = DeploymentStatus, ReplicaStatus
TOKEN_PREFIX = "veri_rt_"
SERVING_KEY_PREFIX = "veri_srv_"  # not an API key's veri_sk_
LAUNCHING = "launching"  # external_id while a task launches the machine
# What a serving process may say of itself: its model would not load (the customer's), its
# engine died after it was ready (the platform's), or, from the machine's bootstrap while the
# replica starts, the machine could not be made ready (the platform's; nothing is billed before
# ready, so believing it costs nothing).
REPORTABLE_CODES = {"model_load_error", "replica_failed", "provisioning_error"}
# Providers whose replicas run the worker's own CPU engine (transformers + PEFT); every other
# provider rents a GPU machine whose replica serves with vLLM.
CPU_ENGINE_PROVIDERS = {"local"}


def _hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


@transaction.atomic
def start_replica(*, deployment: Deployment, another: dict | None = None) -> Replica:
    """A replica for the deployment, unless one is live already (then that one): written here,
    its machine launched by a task once this commits. `another` (why: the load) adds one beside
    the live ones, the deployment staying as it is (ready)."""
    deployment = Deployment.objects.select_for_update().get(pk=deployment.pk)
    live = deployment.replicas.filter(status__in=REPLICA_LIVE).first()
    if live and another is None:
        return live
    gpu = catalog.get_provider(deployment.provider).gpu(deployment.gpu_type)
    replica = Replica.objects.create(
        deployment=deployment,
        provider=deployment.provider,
        price_per_hour_micros=gpu.price_per_gpu_hour_micros * deployment.gpu_count,
    )
    if another is None:
        states.transition(
            deployment_id=deployment.pk, to=S.STARTING, detail={"replica": replica.public_id}
        )
    else:
        states.record_event(
            deployment=deployment,
            type="scaling_up",
            detail={"replica": replica.public_id, **another},
        )
    enqueue_on_commit("serving.tasks.launch_replica", replica_id=replica.pk)
    return replica


def launch_replica(*, replica_id: int) -> str:
    """Launch the replica's machine (the task's body; a second run finds it claimed)."""
    claimed = Replica.objects.filter(pk=replica_id, status=R.STARTING, external_id="").update(
        external_id=LAUNCHING
    )
    if not claimed:
        return "not claimed"
    replica = Replica.objects.select_related("deployment").get(pk=replica_id)
    deployment = replica.deployment
    token = mint_token(replica=replica)
    zone = catalog.get_provider(deployment.provider).zones[deployment.region][0]
    api = settings.VERI_PUBLIC_URL
    vllm = deployment.provider not in CPU_ENGINE_PROVIDERS
    spec = LaunchSpec(
        job_id=replica.public_id,
        region=deployment.region,
        zone=zone,
        gpu_type=deployment.gpu_type,
        gpu_count=deployment.gpu_count,
        api_url=api,
        env={
            "VERI_REPLICA_TOKEN": token,
            "VERI_SERVING_KEY": serving_key(replica=replica),
            "VERI_API_URL": api,
        },
        worker_args=serve_command(replica=replica, api=api, vllm=vllm),
        kind="replicas",
        engine_requirement=settings.VERI_VLLM_REQUIREMENT if vllm else "",
    )
    adapter = get_adapter(deployment.provider)
    try:
        if not adapter.serves_replicas:  # a deployment made before its provider stopped serving
            raise ProviderError(f"{deployment.provider} does not serve deployments yet")
        external_id = adapter.launch(spec)
    except ProviderError as exc:
        Replica.objects.filter(pk=replica.pk).update(external_id="")
        fail_replica(replica=replica, code="provisioning_error", message=str(exc))
        return "provisioning_error"
    Replica.objects.filter(pk=replica.pk).update(external_id=external_id)
    return "launched"


def serve_command(*, replica: Replica, api: str, vllm: bool) -> tuple[str, ...]:
    """The replica's `python -m worker …` command: on a GPU machine, vLLM with one tensor-parallel
    rank per GPU and a LoRA slot for each of the deployment's adapters (all resident at once)."""
    command = ("serve", "--replica", replica.public_id, "--api", api)
    if not vllm:
        return command
    deployment = replica.deployment
    return (
        *command,
        "--engine",
        "vllm",
        "--tensor-parallel-size",
        str(deployment.gpu_count),
        "--max-loras",
        str(max(1, len(deployment.adapters))),
    )


def mint_token(*, replica: Replica) -> str:
    """The replica's token, for its serving process alone (only its hash is kept); an earlier
    one dies."""
    token = f"{TOKEN_PREFIX}{secrets.token_hex(32)}"
    Replica.objects.filter(pk=replica.pk).update(token_hash=_hash(token))
    return token


def serving_key(*, replica: Replica) -> str:
    """The key the replica's server requires of every request (`Authorization: Bearer`): only
    the router sends it, so nothing else that reaches the machine's port is served. Derived from
    SECRET_KEY and the replica's id, so nothing is stored; handed to the machine at launch."""
    digest = hmac.new(
        settings.SECRET_KEY.encode(), f"serving:{replica.public_id}".encode(), hashlib.sha256
    )
    return SERVING_KEY_PREFIX + digest.hexdigest()


def authenticate(*, replica_id: str, raw: str) -> Replica | None:
    """The live replica a token belongs to; None when unknown, or the replica stopped."""
    replica = (
        Replica.objects.filter(public_id=replica_id, status__in=REPLICA_LIVE)
        .exclude(token_hash="")
        .select_related("deployment__workspace")
        .first()
    )
    if replica is None or not hmac.compare_digest(replica.token_hash, _hash(raw)):
        return None
    return replica


def replica_spec(*, replica: Replica) -> dict:
    """What the serving process loads: the base model (its pinned volume files, or a hub id)
    and each adapter's checkpoint files, each file with a presigned URL."""
    deployment, ttl = replica.deployment, settings.VERI_PRESIGN_TTL_SECONDS
    store = store_for(deployment.workspace_prefix)
    base: dict = {"name": deployment.base_model}
    if deployment.base_model.startswith("volume://"):
        name, _, path = deployment.base_model.removeprefix("volume://").partition("/")
        volume = volume_selectors.get_volume(workspace=deployment.workspace, id_or_name=name)
        [(_, files)] = volume_selectors.volumes_with_files(
            workspace=deployment.workspace,
            volume_ids=[volume.public_id],
            pinned_by=deployment.pin_holder,
        )
        folder = path.rstrip("/") + "/"
        vstore = store_for(volume.store_prefix)
        base["files"] = [
            {"path": f["path"].removeprefix(folder), "size": f["size"]}
            | vstore.signed_get(
                f["object_key"], expires=ttl, byte_range=byte_range(f.get("offset"), f["size"])
            )
            for f in files
            if f["path"].startswith(folder)
        ]
    checkpoints = {
        c.public_id: c
        for c in Checkpoint.objects.filter(
            public_id__in=[a["checkpoint_id"] for a in deployment.adapters]
        ).select_related("job__workspace", "workspace")
    }
    return {
        "replica_id": replica.public_id,
        "deployment_id": deployment.public_id,
        "base_model": base,
        "adapters": [
            {"name": a["name"]} | checkpoint_spec(checkpoints[a["checkpoint_id"]], store, ttl)
            for a in deployment.adapters
            if a["checkpoint_id"] in checkpoints
        ],
        "heartbeat_interval_seconds": settings.VERI_REPLICA_HEARTBEAT_SECONDS,
        # Unheard this long, the replica ends itself: the control plane has failed it by then.
        "silent_seconds": settings.VERI_REPLICA_SILENT_SECONDS,
    }


# How a replica names where it serves: its own loopback and a port. Only the port is taken from
# it; the host the router calls is what the provider reports of the machine, so a replica (hostile,
# like anything a worker sends) cannot point the router anywhere else.
REPLICA_HOSTS = {"127.0.0.1", "localhost", "::1"}


def router_url(*, replica: Replica, url: str) -> str:
    """The URL the router sends the replica's requests to: the provider's address of its machine
    and the port the replica reports (one of the ports its provider opened)."""
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:  # out of range
        port = None
    if parts.hostname not in REPLICA_HOSTS or port is None:
        raise VeriError("A replica reports its machine's loopback address and port.", field="url")
    adapter = get_adapter(replica.provider)
    ports = adapter.serving_ports
    if ports is not None and port not in ports:
        raise VeriError(
            f"A replica serves on a port from {ports.start} to {ports.stop - 1}.", field="url"
        )
    address = None
    launched = replica.external_id not in ("", LAUNCHING)
    # A provider that does not serve replicas has no address for them; the local one's (its
    # loopback, open to no one else) needs no machine id.
    if adapter.serves_replicas and (launched or ports is None):
        try:
            address = adapter.replica_address(replica.external_id)
        except Exception:  # noqa: BLE001 - any failure of the provider's API: refused for now
            log.warning("no address for replica %s", replica.public_id, exc_info=True)
    if not address:
        raise VeriError("The provider reports no address for the replica's machine.", field="url")
    host = f"[{address}]" if ":" in address else address
    return f"http://{host}:{port}"


def mark_ready(*, replica: Replica, url: str) -> Replica:
    """The replica serves: the router reaches it at `router_url`. A report the control plane
    cannot turn into an address of the machine is refused (the replica stays starting, and
    times out as the catalog says)."""
    url = router_url(replica=replica, url=url)
    with transaction.atomic():
        changed = Replica.objects.filter(pk=replica.pk, status=R.STARTING).update(
            status=R.READY, url=url, ready_at=timezone.now(), last_heartbeat_at=timezone.now()
        )
        if changed:
            deployment = replica.deployment
            states.transition(
                deployment_id=deployment.pk, to=S.READY, detail={"replica": replica.public_id}
            )
    return Replica.objects.get(pk=replica.pk)


def heartbeat(*, replica: Replica) -> None:
    Replica.objects.filter(pk=replica.pk).update(last_heartbeat_at=timezone.now())


def report_failure(*, replica: Replica, code: str, message: str) -> None:
    if code not in REPORTABLE_CODES:
        raise VeriError(
            f"A replica reports only {', '.join(sorted(REPORTABLE_CODES))}.", field="code"
        )
    if code == "provisioning_error" and replica.status != R.STARTING:
        raise VeriError(
            "Only a starting replica's machine reports provisioning_error.", field="code"
        )
    # A model that will not load will not load on the next replica either; an engine that died
    # may serve again on a new one (the next request starts it).
    fail_replica(
        replica=replica, code=code, message=message, end_deployment=code == "model_load_error"
    )


def _terminate(replica: Replica) -> None:
    """Terminate-always: the machine is asked to go whatever else failed."""
    if replica.external_id and replica.external_id != LAUNCHING:
        try:
            get_adapter(replica.provider).terminate(replica.external_id)
        except ProviderError:  # the sweeper finds it on its next pass
            log.warning("could not terminate replica %s", replica.public_id, exc_info=True)


def _end(replica: Replica, status: ReplicaStatus, **fields) -> bool:
    """Mark the replica ended (its token dies with it), terminate its machine and charge its
    uptime up to the end; when the catalog credits how it failed (the platform lost it), the
    stretch since its last charge is credited back at once, as a job's lost compute is. False
    when something ended it already."""
    ended = Replica.objects.filter(pk=replica.pk, status__in=REPLICA_LIVE).update(
        status=status, token_hash="", stopped_at=timezone.now(), **fields
    )
    if not ended:  # whoever ended it terminated its machine (or its deployment is deleted)
        return False
    replica.refresh_from_db()
    _terminate(replica)
    start = replica.charged_until or replica.ready_at
    charged = charge_uptime(replica=replica, until=replica.stopped_at)
    code = fields.get("error_code")
    if charged and code and errors.get(code).billing == errors.Billing.REFUND:
        hooks.credit_uptime(
            workspace=replica.deployment.workspace,
            amount_micros=charged,
            key=f"deployment_credit:{replica.public_id}",
            description=f"Deployment {replica.deployment.public_id}, replica "
            f"{replica.public_id}: {code} since {start:%Y-%m-%d %H:%M:%S}",
        )
    return True


def accrued_micros(*, replica: Replica, until: datetime) -> int:
    """The replica's uptime not charged yet, up to `until`."""
    start = replica.charged_until or replica.ready_at
    if start is None or until <= start:
        return 0
    price = replica.price_per_hour_micros
    return compute_micros(price_per_hour_micros=price, start=start, end=until)


def charge_uptime(*, replica: Replica, until: datetime) -> int:
    """Charge the replica's uptime from where it was last charged (or from ready) to `until`,
    per second; what was charged (0: nothing due, or another run charged it). The window is
    claimed with a conditional UPDATE in the charge's transaction, so two runs never charge it
    twice."""
    start = replica.charged_until or replica.ready_at
    if start is None or until <= start:
        return 0
    amount = accrued_micros(replica=replica, until=until)
    with transaction.atomic():
        claimed = Replica.objects.filter(pk=replica.pk, charged_until=replica.charged_until).update(
            charged_until=until
        )
        if not claimed:
            return 0
        seconds = int((until - start).total_seconds())
        hooks.charge_uptime(
            workspace=replica.deployment.workspace,
            amount_micros=amount,
            key=f"deployment_charge:{replica.public_id}:{start.isoformat()}",
            description=f"Deployment {replica.deployment.public_id}, replica "
            f"{replica.public_id}: {seconds} s",
        )
    return amount


def charge_running(*, now: datetime) -> int:
    """Ready replicas are charged at least every VERI_DEPLOYMENT_CHARGE_SECONDS."""
    due = now - timedelta(seconds=settings.VERI_DEPLOYMENT_CHARGE_SECONDS)
    charged = 0
    ready = Replica.objects.filter(status=R.READY).select_related("deployment__workspace")
    for replica in ready.filter(
        Q(charged_until__lte=due) | Q(charged_until__isnull=True, ready_at__lte=due)
    ):
        charged += bool(charge_uptime(replica=replica, until=now))
    return charged


def fail_replica(
    *, replica: Replica, code: str, message: str = "", end_deployment: bool = False
) -> None:
    """A replica that failed: ended, its machine terminated; the deployment fails with it when
    nothing can fix it by retrying (`end_deployment`, or a replica that never became ready),
    else it stops until the next request starts a new replica."""
    if not _end(replica, R.FAILED, error_code=code, error_message=message[:10_000]):
        return
    deployment = replica.deployment
    states.record_event(
        deployment=deployment,
        type="replica_failed",
        detail={"replica": replica.public_id, "code": code, "message": message[:2000]},
    )
    if deployment.replicas.filter(status__in=REPLICA_LIVE).exists():
        return
    deployment.refresh_from_db()
    with transaction.atomic():
        if end_deployment or deployment.status == S.STARTING:
            states.transition(
                deployment_id=deployment.pk, to=S.FAILED, error_code=code, message=message
            )
        elif deployment.status != S.FAILED:
            states.transition(deployment_id=deployment.pk, to=S.STOPPED)
            if deployment.min_replicas:
                start_replica(deployment=deployment)


def stop_replicas(*, deployment: Deployment, reason: str, keep: int = 0) -> int:
    """Stop the deployment's live replicas beyond `keep` (newest first), machines terminated."""
    live = list(deployment.replicas.filter(status__in=REPLICA_LIVE).order_by("-pk"))
    stopped = 0
    for replica in live[keep:] if keep else live:
        if _end(replica, R.STOPPED):
            states.record_event(
                deployment=deployment,
                type="replica_stopped",
                detail={"replica": replica.public_id, "reason": reason},
            )
            stopped += 1
    return stopped


def scale_idle(*, now: datetime) -> int:
    """Deployments idle for their `idle_timeout_seconds` go down to `min_replicas` (to zero:
    `scaling_down`, then `stopped`). Each row is claimed with SKIP LOCKED, so concurrent runs
    and a request waking it never both act on it."""
    scaled = 0
    for pk in Deployment.objects.filter(status=S.READY).values_list("pk", flat=True):
        with transaction.atomic():
            deployment = (
                Deployment.objects.select_for_update(skip_locked=True)
                .filter(pk=pk, status=S.READY)
                .first()
            )
            if deployment is None:
                continue
            idle_since = deployment.last_active_at or deployment.created_at
            if now - idle_since < timedelta(seconds=deployment.idle_timeout_seconds):
                continue
            if deployment.inflight.filter(expires_at__gt=now).exists():
                continue  # a long answer is still streaming: not idle
            live = deployment.replicas.filter(status__in=REPLICA_LIVE).count()
            if live <= deployment.min_replicas:
                continue
            if deployment.min_replicas == 0:
                states.transition(deployment_id=pk, to=S.SCALING_DOWN, detail={"idle": True})
            stop_replicas(deployment=deployment, reason="idle", keep=deployment.min_replicas)
            if deployment.min_replicas == 0:
                states.transition(deployment_id=pk, to=S.STOPPED, detail={"scaled_to_zero": True})
            scaled += 1
    return scaled


def stop_unfunded(*, now: datetime) -> int:
    """Deployments of workspaces whose balance, less their replicas' uptime not charged yet, is
    spent: every replica stopped (its machine terminated, its uptime charged) and the deployment
    stopped with the catalog's `balance_exhausted` until a request after a top-up wakes it."""
    owed: dict[int, int] = {}
    for replica in Replica.objects.filter(status__in=REPLICA_LIVE).select_related("deployment"):
        workspace_id = replica.deployment.workspace_id
        owed[workspace_id] = owed.get(workspace_id, 0) + accrued_micros(replica=replica, until=now)
    spent = hooks.out_of_funds(accrued_micros=owed)
    stopped = 0
    for pk in Deployment.objects.filter(
        workspace_id__in=spent, status__in=[S.STARTING, S.READY]
    ).values_list("pk", flat=True):
        with transaction.atomic():
            deployment = (
                Deployment.objects.select_for_update(skip_locked=True)
                .filter(pk=pk, status__in=[S.STARTING, S.READY])
                .first()
            )
            if deployment is None:
                continue
            states.transition(deployment_id=pk, to=S.SCALING_DOWN, detail={"balance": "spent"})
            stop_replicas(deployment=deployment, reason="balance_exhausted")
            states.transition(
                deployment_id=pk,
                to=S.STOPPED,
                error_code="balance_exhausted",
                message="The workspace's balance ran out: every replica was stopped and its "
                f"machine terminated. {hooks.credit_hint()}; the next request wakes the "
                "deployment.",
            )
            stopped += 1
    return stopped


def check_health(*, now: datetime) -> int:
    """Replicas whose machine is gone, that went silent, or that never became ready in time are
    failed with the catalog's code (their machines terminated)."""
    failed = 0
    live = list(
        Replica.objects.filter(status__in=REPLICA_LIVE)
        .exclude(external_id__in=["", LAUNCHING])
        .select_related("deployment")
    )
    by_provider: dict[str, list[str]] = {}
    for replica in live:
        by_provider.setdefault(replica.provider, []).append(replica.external_id)
    found = machine_states(by_provider)
    start_limit = timedelta(seconds=settings.VERI_REPLICA_START_TIMEOUT_SECONDS)
    silent_limit = timedelta(seconds=settings.VERI_REPLICA_SILENT_SECONDS)
    for replica in live:
        state = found.get(replica.external_id)
        if state is not None and not state.alive:
            code = "replica_failed" if replica.status == R.READY else "replica_start_timeout"
            message = "The replica's serving process is gone."
        elif replica.status == R.STARTING and now - replica.created_at > start_limit:
            code, message = "replica_start_timeout", ""
        elif replica.last_heartbeat_at and now - replica.last_heartbeat_at > silent_limit:
            code, message = "replica_failed", "The replica stopped sending heartbeats."
        else:
            continue
        fail_replica(replica=replica, code=code, message=message)
        failed += 1
    return failed


def live_machines(tagged: set[str]) -> dict[str, str | None]:
    """Training's sweeper hook: of the tagged ids, the live replicas with their machine ids."""
    rows = Replica.objects.filter(public_id__in=tagged, status__in=REPLICA_LIVE)
    return {
        public_id: (None if external in ("", LAUNCHING) else external)
        for public_id, external in rows.values_list("public_id", "external_id")
    }
