"""Which providers this deployment can use, their adapters, the sweep for machines left
renting, and every write of the machine rows (`Instance`, `LaunchAttempt`): training decides
when a machine is reserved, launched or ended, and calls these."""

import logging
import time
from collections.abc import Callable
from functools import cache

from django.conf import settings
from django.db import transaction
from django.utils import timezone
from django.utils.module_loading import import_string

from providers.base import NoFreeSlot, ProviderAdapter, ProviderUnavailable
from providers.catalog import GpuType, ProviderSpec, providers
from providers.models import Instance, LaunchAttempt, ProviderLock

log = logging.getLogger(__name__)
_availability: dict[tuple[str, str], tuple[float, list[str] | None]] = {}
KEEP = object()  # `record_machine`: leave `launched_at` as it is


@cache
def _adapter(path: str) -> ProviderAdapter:
    return import_string(path)()


def get_adapter(name: str) -> ProviderAdapter | None:
    path = settings.VERI_PROVIDER_ADAPTERS.get(name)
    return _adapter(path) if path else None


def is_usable(name: str) -> bool:
    adapter = get_adapter(name)
    return adapter is not None and adapter.is_configured()


def usable_providers() -> list[ProviderSpec]:
    return [spec for spec in providers() if is_usable(spec.name)]


def default_provider() -> str:
    if settings.VERI_DEFAULT_PROVIDER:
        return settings.VERI_DEFAULT_PROVIDER
    return "aws" if is_usable("aws") else "local"


def reserve_instance(*, job, zone: str, gpu: GpuType, queued_ahead: Callable[[], int]) -> Instance:
    """The Instance row for a launch. On a provider with a limit of machines (the local one's
    VERI_LOCAL_SLOTS, GCP's one GPU) it takes a slot, under a row lock so that two launches cannot
    both take the last one, in submit order; NoFreeSlot when none is free. `queued_ahead` (asked
    under the lock, so concurrent launches see each other) counts the jobs waiting for this
    provider that were submitted before this one: the caller, which owns jobs, knows them."""
    with transaction.atomic():
        limit = get_adapter(job.provider).max_instances()
        if limit is not None:
            ProviderLock.objects.get_or_create(name=job.provider)
            ProviderLock.objects.select_for_update().get(name=job.provider)
            busy = Instance.objects.filter(
                provider=job.provider, terminated_at__isnull=True
            ).count()
            # First come, first served: the free slots belong to the oldest queued jobs.
            ahead = queued_ahead()
            if busy + ahead >= limit:
                raise NoFreeSlot(f"all {limit} {job.provider} slot(s) are busy")
        Instance.objects.filter(job=job).delete()  # an earlier attempt's row that never launched
        return Instance.objects.create(
            job=job,
            provider=job.provider,
            region=job.region,
            zone=zone,
            gpu_type=gpu.name,
            gpu_count=job.gpu_count,
            price_per_hour_micros=gpu.price_per_gpu_hour_micros * job.gpu_count,
        )


def machine_states(ids_by_provider: dict[str, list[str]]) -> dict[str, str]:
    """Each machine's state as its provider reports it (`ProviderAdapter.states`). A provider
    whose poll fails is left out: one failed poll is no evidence, the next run asks again."""
    found: dict[str, str] = {}
    for provider, ids in ids_by_provider.items():
        try:
            found |= get_adapter(provider).states(ids)
        except Exception:  # noqa: BLE001 - any failure of the provider's API
            log.warning("could not poll %s for %d machine(s)", provider, len(ids), exc_info=True)
    return found


def available_regions(name: str, gpu_type: str) -> list[str] | None:
    """Where the provider says `gpu_type` can launch now, asked at most once per the adapter's
    `availability_ttl_seconds`; None when it does not say (also when it cannot be reached: the
    catalog still answers, with availability unknown)."""
    adapter = get_adapter(name)
    cached = _availability.get((name, gpu_type))
    if cached and time.monotonic() - cached[0] < adapter.availability_ttl_seconds:
        return cached[1]
    try:
        regions = adapter.available_regions(gpu_type)
    except ProviderUnavailable:
        return None  # the provider does not say right now; asked again on the next call
    _availability[(name, gpu_type)] = (time.monotonic(), regions)
    return regions


def sweep_orphans(*, live_jobs: Callable[[set[str]], dict[str, str | None]]) -> list[str]:
    """Terminate every machine tagged as ours that no live job owns: its job ended or is unknown,
    or the job's recorded instance is another one (a launch that was retried). A live job whose
    launch is still in flight (no instance id recorded yet) keeps its machine. `live_jobs` maps
    the tagged job ids to those of live jobs, each with its recorded instance id: the caller,
    which owns jobs, knows them."""
    swept = []
    for name in settings.VERI_PROVIDER_ADAPTERS:
        adapter = get_adapter(name)
        if not adapter.is_configured():
            continue
        tagged = adapter.tagged_instances()
        if not tagged:
            continue
        live = live_jobs(set(tagged.values()))
        for external_id, job_id in tagged.items():
            if job_id in live and live[job_id] in (None, "", external_id):
                continue
            adapter.terminate(external_id)
            Instance.objects.filter(
                provider=name, external_id=external_id, terminated_at__isnull=True
            ).update(terminated_at=timezone.now())
            log.warning("swept %s instance %s of job %r", name, external_id, job_id or "?")
            swept.append(external_id)
    return swept


# Rows of machines: training decides when, these write them (its services call down here).


def record_launch_attempt(*, job, zone: str, outcome: str, message: str = "") -> LaunchAttempt:
    """One try at launching the job's machine in `zone`, and how it went."""
    return LaunchAttempt.objects.create(
        job=job, provider=job.provider, zone=zone, outcome=outcome, message=message
    )


def record_machine(*, instance: Instance, external_id: str, launched_at=KEEP) -> bool:
    """The provider's machine for a reservation, and (unless `KEEP`) when it launched, when its
    cost starts (None: still being found). False when the reservation is gone: the watchdog
    took the launch for dead and released it, so the machine is not the job's."""
    fields = {"external_id": external_id}
    if launched_at is not KEEP:
        fields["launched_at"] = launched_at
    return bool(Instance.objects.filter(pk=instance.pk).update(**fields))


def machine_obtained(*, job) -> None:
    """A provider that fulfils requests later has the job's machine: its cost starts now (once)."""
    Instance.objects.filter(job=job, launched_at__isnull=True).update(launched_at=timezone.now())


def discard_instance(*, instance: Instance) -> None:
    """Drop a reservation that launched nothing, or the row of a run that ended (a restart)."""
    instance.delete()


def release_reservation(*, job) -> None:
    """Drop the job's reservation whose launch recorded no machine (a stalled launch)."""
    Instance.objects.filter(job=job, external_id="").delete()


def stop_cost(*, instance: Instance) -> bool:
    """The machine's cost stops now, unless something stopped it already."""
    return bool(
        Instance.objects.filter(pk=instance.pk, terminated_at__isnull=True).update(
            terminated_at=timezone.now()
        )
    )


def terminate_machine(*, instance: Instance) -> None:
    """Ask the provider to delete the machine (when one was recorded), then stop its cost."""
    if instance.external_id:
        get_adapter(instance.provider).terminate(instance.external_id)
    stop_cost(instance=instance)
