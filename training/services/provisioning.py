"""Launching a job's machine: zone by zone on its provider, each refusal recorded and mapped to
the catalog's codes with the message a customer reads; a provider that fulfils requests later
(Flex-start) leaves the job queued until the machine is there."""

import contextlib
import threading

from django.conf import settings
from django.db import connection
from django.utils import timezone

from providers import catalog
from providers import services as provider_services
from providers.base import (
    CapacityError,
    ControlPlaneUnreachable,
    FundsError,
    LaunchSpec,
    NoFreeSlot,
    ProviderError,
    QuotaError,
)
from providers.models import Instance
from providers.services import get_adapter, reserve_instance, usable_providers
from training import hooks
from training.models import TERMINAL, JobEvent, JobStatus, TrainingJob
from training.services import jobs
from training.services.worker import mint_job_token
from veri.queue import enqueue_on_commit

S = JobStatus
MAX_LAUNCH_RETRIES = 3


def _alternative(job: TrainingJob, refused: str) -> str:
    """`or use: …` naming a shape on another usable provider, for quota and funds failures."""
    for spec in usable_providers():
        if spec.name == refused or job.region not in spec.zones:
            continue
        gpu = spec.gpu(job.gpu_type) or spec.gpus[0]
        return f"or use: provider={spec.name} gpu_type={gpu.name} region={job.region}"
    return "or use: another provider once one is configured (none other is usable right now)"


def _notice_env(adapter, job_id: str) -> dict[str, str]:
    notice = adapter.preemption_notice(job_id)
    return {"VERI_WORKER_PREEMPTION_NOTICE": notice} if notice else {}


def launch_job(*, job_id: int) -> str:
    """Launch the job's instance, trying each capable zone up to `max_launch_attempts`.
    The claim (a conditional UPDATE) makes a second concurrent run a no-op."""
    claimed = TrainingJob.objects.filter(
        pk=job_id, status=S.QUEUED, launch_claimed_at__isnull=True
    ).update(launch_claimed_at=timezone.now())
    if not claimed:
        return "not claimed: launched, finished or being launched elsewhere"
    job = TrainingJob.objects.select_related("workspace").get(pk=job_id)
    spec, adapter = catalog.get_provider(job.provider), get_adapter(job.provider)
    gpu = spec.gpu(job.gpu_type)
    zones = spec.zones.get(job.region, ())[: job.max_launch_attempts]
    tried = []
    for zone in zones:
        try:
            instance = reserve_instance(
                job=job, zone=zone, gpu=gpu, queued_ahead=lambda: _queued_ahead(job)
            )
        except NoFreeSlot:
            TrainingJob.objects.filter(pk=job.pk).update(launch_claimed_at=None)
            return "waiting for a free slot"
        token = mint_job_token(job=job)
        launch = LaunchSpec(
            job_id=job.public_id,
            region=job.region,
            zone=zone,
            gpu_type=gpu.name,
            gpu_count=job.gpu_count,
            api_url=settings.VERI_PUBLIC_URL,
            env={"VERI_JOB_TOKEN": token, "VERI_API_URL": settings.VERI_PUBLIC_URL}
            | _notice_env(adapter, job.public_id),
        )
        try:
            with _launch_lease(job.pk):
                external_id = adapter.launch(launch)
        except ControlPlaneUnreachable as exc:
            provider_services.discard_instance(instance=instance)
            jobs.fail_job(job_id=job.pk, code="provisioning_error", message=str(exc))
            return "provisioning_error"
        except ProviderError as exc:
            provider_services.discard_instance(instance=instance)
            outcome = {CapacityError: "capacity", QuotaError: "quota", FundsError: "funds"}.get(
                type(exc), "error"
            )
            provider_services.record_launch_attempt(
                job=job, zone=zone, outcome=outcome, message=str(exc)
            )
            JobEvent.objects.create(
                job=job,
                type="launch_attempt_failed",
                detail={"zone": zone, "outcome": outcome, "message": str(exc)},
            )
            if not isinstance(exc, CapacityError | QuotaError | FundsError):
                # Refused for a reason that is not capacity (an image that cannot be looked up,
                # credentials refused, a parameter rejected): the deployment's configuration,
                # the same in every zone, so it ends here as the platform's fault, in the
                # provider's own words; never "no capacity", which would blame the customer.
                if moved := _restart_elsewhere(job):
                    return moved
                jobs.fail_job(
                    job_id=job.pk,
                    code="provisioning_error",
                    message=(
                        f"{job.provider} refused to launch the machine: "
                        f"{str(exc).rstrip('. ')}. This is Veri's "
                        "configuration, not your job: nothing booted and nothing is billed. "
                        f"Retry later, {_alternative(job, job.provider)}"
                    ),
                )
                return "provisioning_error"
            if isinstance(exc, QuotaError | FundsError):
                code = "QUOTA_EXCEEDED" if isinstance(exc, QuotaError) else "PROVIDER_OUT_OF_FUNDS"
                what = (
                    "Veri's account limit"
                    if isinstance(exc, QuotaError)
                    else "Veri's prepaid balance"
                )
                message = (
                    f"{what} on {job.provider} is exhausted ({exc}). Nothing booted and "
                    f"nothing is billed. Retry in a few minutes, {_alternative(job, job.provider)}"
                )
                if moved := _restart_elsewhere(job):
                    return moved
                jobs.fail_job(job_id=job.pk, code=code, message=message)
                return code
            tried.append(zone)
            continue
        if adapter.waits_for_capacity:
            # The provider finds the machine later: the job stays queued and unbilled until the
            # watchdog (or the worker registering) sees it obtained.
            if not provider_services.record_machine(instance=instance, external_id=external_id):
                return _superseded(adapter, external_id)
            provider_services.record_launch_attempt(job=job, zone=zone, outcome="requested")
            JobEvent.objects.create(
                job=job, type="capacity_requested", detail={"zone": zone, "instance": external_id}
            )
            if TrainingJob.objects.filter(pk=job.pk, status__in=TERMINAL).exists():
                return _ended_while_launching(adapter, instance, external_id)
            return "requested: the provider is finding the machine"
        if not provider_services.record_machine(
            instance=instance, external_id=external_id, launched_at=timezone.now()
        ):
            return _superseded(adapter, external_id)
        provider_services.record_launch_attempt(job=job, zone=zone, outcome="launched")
        try:
            jobs.transition_job(
                job_id=job.pk, to=S.PROVISIONING, detail={"zone": zone, "instance": external_id}
            )
        except jobs.InvalidTransition:  # cancelled or timed out while launching
            return _ended_while_launching(adapter, instance, external_id)
        return "launched"
    if moved := _restart_elsewhere(job):
        return moved
    jobs.fail_job(
        job_id=job.pk,
        code="CAPACITY_UNAVAILABLE",
        message=(
            f"No capacity for {job.gpu_count}x {job.gpu_type} on {job.provider} in "
            f"{job.region}; tried zones: {', '.join(tried) or 'none'}. Retry later, pick a "
            "different gpu_type, or launch in another region (veri regions list)."
        ),
    )
    return "CAPACITY_UNAVAILABLE"


def _restart_elsewhere(job: TrainingJob) -> str | None:
    """A restarted job (its run lost to a platform fault) that its provider cannot place again
    goes to another usable provider offering the same GPU in the job's region, where its volumes
    are, rather than ending; a first launch keeps the provider the customer got at submit."""
    if job.attempt < 2:
        return None
    for spec in usable_providers():
        if spec.name == job.provider or spec.gpu(job.gpu_type) is None:
            continue
        if not spec.zones.get(job.region):
            continue
        if not TrainingJob.objects.filter(pk=job.pk, status=S.QUEUED).update(
            provider=spec.name, launch_claimed_at=None
        ):
            return "not moved: the job was cancelled meanwhile"
        JobEvent.objects.create(
            job=job,
            type="provider_switched",
            detail={"from": job.provider, "to": spec.name, "attempt": job.attempt},
        )
        enqueue_on_commit("training.tasks.provision_job", job_id=job.pk)
        return f"moved to {spec.name}"
    return None


def _ended_while_launching(adapter, instance: Instance, external_id: str) -> str:
    """The job was cancelled (or timed out) while its machine was being launched: the cancel
    found no machine id to terminate, so the launch terminates what it got."""
    adapter.terminate(external_id)
    provider_services.stop_cost(instance=instance)
    return "launched, but the job had already ended: terminated"


@contextlib.contextmanager
def _launch_lease(job_id: int):
    """Renews `launch_heartbeat_at` while the provider call runs, so that the watchdog takes only
    a launch whose task died for stalled, never a slow one."""
    done = threading.Event()

    def renew() -> None:
        try:
            while not done.wait(settings.VERI_LAUNCH_STALL_SECONDS / 3):
                TrainingJob.objects.filter(pk=job_id).update(launch_heartbeat_at=timezone.now())
        finally:
            connection.close()  # this thread's own connection

    thread = threading.Thread(target=renew, name=f"launch-lease-{job_id}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


def _superseded(adapter, external_id: str) -> str:
    """This launch took so long that the watchdog took it for dead and released its reservation
    (see `recover_stalled_launch`): the machine it got is not the job's."""
    adapter.terminate(external_id)
    return "superseded: the launch was retried elsewhere; its machine was terminated"


def launch_stalled(job: TrainingJob, *, now) -> bool:
    """A launch that never recorded its machine and whose task has given no sign of life (the
    claim, the lease renewed during the provider call) for `VERI_LAUNCH_STALL_SECONDS`: the task
    died (a task worker killed, a broker restarted)."""
    if not job.launch_claimed_at:
        return False
    last_sign = max(filter(None, (job.launch_claimed_at, job.launch_heartbeat_at)))
    if (now - last_sign).total_seconds() <= settings.VERI_LAUNCH_STALL_SECONDS:
        return False
    instance = getattr(job, "instance", None)
    return instance is None or not instance.external_id


def recover_stalled_launch(*, job: TrainingJob) -> str:
    """Adopt the machine the provider has tagged with this job, if the dead launch got that far;
    else release the reservation and claim so that the launch runs again. Never a second
    machine: the lease keeps a slow launch from being taken for dead, a launch released anyway
    finds its reservation gone and terminates what it got, and the sweeper terminates a tagged
    machine that is not the job's."""
    adapter = get_adapter(job.provider)
    mine = sorted(i for i, owner in adapter.tagged_instances().items() if owner == job.public_id)
    instance = Instance.objects.filter(job=job, external_id="").first()
    if mine and instance:
        keep, *extra = mine
        for external_id in extra:
            adapter.terminate(external_id)
        # A machine still being found (Flex-start) is billed once obtained, as in `launch_job`.
        waiting = adapter.waits_for_capacity
        provider_services.record_machine(
            instance=instance, external_id=keep, launched_at=None if waiting else timezone.now()
        )
        provider_services.record_launch_attempt(
            job=job, zone=instance.zone, outcome="requested" if waiting else "launched"
        )
        JobEvent.objects.create(job=job, type="launch_recovered", detail={"instance": keep})
        if job.status == S.QUEUED and not waiting:
            try:
                jobs.transition_job(
                    job_id=job.pk, to=S.PROVISIONING, detail={"instance": keep, "adopted": True}
                )
            except jobs.InvalidTransition:
                return _ended_while_launching(adapter, instance, keep)
        return "adopted"
    if job.status != S.QUEUED:
        return "running without a recorded machine: left to its heartbeat deadline"
    retries = JobEvent.objects.filter(job=job, type="launch_retried").count()
    if retries >= MAX_LAUNCH_RETRIES:
        jobs.fail_job(
            job_id=job.pk,
            code="launch_timeout",
            message=(
                f"The {job.provider} launch was interrupted {retries + 1} times and was stopped. "
                "Not billed. Retry later."
            ),
        )
        return "launch_timeout"
    provider_services.release_reservation(job=job)
    released = TrainingJob.objects.filter(
        pk=job.pk, status=S.QUEUED, launch_claimed_at=job.launch_claimed_at
    ).update(launch_claimed_at=None)
    if not released:
        return "moved on meanwhile"
    JobEvent.objects.create(job=job, type="launch_retried", detail={"after": "a stalled launch"})
    enqueue_on_commit("training.tasks.provision_job", job_id=job.pk)
    return "released: launching again"


def _queued_ahead(job: TrainingJob) -> int:
    """First come, first served: the free slots belong to the oldest queued jobs."""
    return TrainingJob.objects.filter(
        provider=job.provider, status=JobStatus.QUEUED, pk__lt=job.pk
    ).count()


def sweep_orphans() -> list[str]:
    """Terminate every provider machine tagged as ours that no live job owns (see
    `providers.services.sweep_orphans`); returns their instance ids."""
    return provider_services.sweep_orphans(live_jobs=_live_jobs)


def _live_jobs(job_ids: set[str]) -> dict[str, str | None]:
    """Of these job ids, the jobs not ended, each with its recorded instance id (None or empty
    while its launch is in flight)."""
    live = dict(
        TrainingJob.objects.filter(public_id__in=job_ids)
        .exclude(status__in=TERMINAL)
        .values_list("public_id", "instance__external_id")
    )
    return live | hooks.live_machines(job_ids - set(live))  # a higher floor's (replicas)
