"""Startup checks of the Tinker face's settings."""

from django.conf import settings
from django.core import checks

from providers import catalog
from providers.services import get_adapter


@checks.register(checks.Tags.compatibility)
def models_run_where_a_worker_can_start(app_configs, **kwargs) -> list[checks.CheckMessage]:
    """A Tinker model's uptime is billed from its machine's launch, at its catalog price, so it
    runs only where a worker starts at once with its token: the local provider, or a cloud
    provider whose machine's bootstrap (providers/bootstrap.py) runs `python -m worker tinker`.
    Refused: a provider this deployment does not offer (VERI_PROVIDERS), a GPU type its catalog
    does not list, a region it has no zone in, a provider that rents later (GCP Flex-start: the
    model would be billed while GCP looks for a GPU), and a GPU type the provider rents only
    several to a machine (EC2's A100s and H100s: the model is billed for one GPU)."""
    provider = settings.VERI_TINKER_PROVIDER
    problem = _problem(provider, settings.VERI_TINKER_GPU_TYPE, settings.VERI_DEFAULT_REGION)
    if problem is None:
        return []
    return [
        checks.Error(
            f"VERI_TINKER_PROVIDER={provider!r}: Tinker models cannot run there: {problem}.",
            hint="Unset VERI_TINKER_PROVIDER and VERI_TINKER_GPU_TYPE (their defaults are "
            "local, cpu).",
            id="tinker_api.E001",
        )
    ]


def _problem(provider: str, gpu_type: str, region: str) -> str | None:
    spec = catalog.get_provider(provider)
    if provider not in settings.VERI_PROVIDER_ADAPTERS or spec is None:
        offered = ", ".join(settings.VERI_PROVIDER_ADAPTERS)
        return f"it is not one of this deployment's VERI_PROVIDERS ({offered})"
    if spec.gpu(gpu_type) is None:
        listed = ", ".join(g.name for g in spec.gpus)
        return f"its catalog has no GPU type {gpu_type!r} (VERI_TINKER_GPU_TYPE): {listed}"
    if not spec.zones.get(region):
        return f"it has no zone in VERI_DEFAULT_REGION={region!r}"
    adapter = get_adapter(provider)
    if adapter.waits_for_capacity:
        return (
            "it rents a machine only once it finds a GPU, and a Tinker model is billed from "
            "its launch"
        )
    if (count := adapter.gpus_per_machine(gpu_type)) != 1:
        return (
            f"its smallest machine with {gpu_type} carries {count} GPUs, and a Tinker model "
            "rents one machine billed for one GPU"
        )
    return None
