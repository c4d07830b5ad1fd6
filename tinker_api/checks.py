"""Startup checks of the Tinker face's settings."""

from django.conf import settings
from django.core import checks


@checks.register(checks.Tags.compatibility)
def models_run_where_a_worker_can_start(app_configs, **kwargs) -> list[checks.CheckMessage]:
    """A Tinker model's uptime is billed, but only the `local` provider can start its worker: a
    rented machine's bootstrap fetches and runs a job's or a replica's worker with their tokens
    (providers/bootstrap.py), not `python -m worker tinker` with a model's, so on a cloud
    provider the machine would run, billed, with no worker."""
    if settings.VERI_TINKER_PROVIDER == "local":
        return []
    return [
        checks.Error(
            f"VERI_TINKER_PROVIDER={settings.VERI_TINKER_PROVIDER!r}: Tinker models run only on "
            "the local provider until a rented machine's bootstrap can start their worker.",
            hint="Unset VERI_TINKER_PROVIDER (its default is local).",
            id="tinker_api.E001",
        )
    ]
