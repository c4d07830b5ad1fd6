"""Startup checks of the Tinker face's settings."""

from django.conf import settings
from django.core import checks
from django.utils.module_loading import import_string

from providers import catalog


@checks.register(checks.Tags.compatibility)
def models_run_where_a_worker_can_start(app_configs, **kwargs) -> list[checks.CheckMessage]:
    """A Tinker model's uptime is billed from its machine's launch, at its catalog price, so it
    runs only where a worker starts at once with its token: the local provider, or a cloud
    provider whose machine's bootstrap (providers/bootstrap.py) runs `python -m worker tinker`.
    Refused: a provider this deployment does not offer (VERI_PROVIDERS), a GPU type its catalog
    does not list, a region it has no zone in, and a provider that rents later (GCP Flex-start:
    the model would be billed while GCP looks for a GPU)."""
    provider, gpu_type = settings.VERI_TINKER_PROVIDER, settings.VERI_TINKER_GPU_TYPE
    region = settings.VERI_DEFAULT_REGION
    hint = "Unset VERI_TINKER_PROVIDER and VERI_TINKER_GPU_TYPE (their defaults are local, cpu)."
    spec = catalog.get_provider(provider)
    if provider not in settings.VERI_PROVIDER_ADAPTERS or spec is None:
        offered = ", ".join(settings.VERI_PROVIDER_ADAPTERS)
        problem = f"it is not one of this deployment's VERI_PROVIDERS ({offered})"
    elif spec.gpu(gpu_type) is None:
        listed = ", ".join(g.name for g in spec.gpus)
        problem = f"its catalog has no GPU type {gpu_type!r} (VERI_TINKER_GPU_TYPE): {listed}"
    elif not spec.zones.get(region):
        problem = f"it has no zone in VERI_DEFAULT_REGION={region!r}"
    elif import_string(settings.VERI_PROVIDER_ADAPTERS[provider]).waits_for_capacity:
        problem = (
            "it rents a machine only once it finds a GPU, and a Tinker model is billed from "
            "its launch"
        )
    else:
        return []
    return [
        checks.Error(
            f"VERI_TINKER_PROVIDER={provider!r}: Tinker models cannot run there: {problem}.",
            hint=hint,
            id="tinker_api.E001",
        )
    ]
