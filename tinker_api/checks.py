"""Startup checks of the Tinker face's settings."""

from django.conf import settings
from django.core import checks


@checks.register(checks.Tags.compatibility)
def models_run_where_they_cost_nothing(app_configs, **kwargs) -> list[checks.CheckMessage]:
    """A Tinker model's machine is not billed yet: on a rented GPU it would be free to the
    workspace and paid by the operator, so only the `local` provider is accepted."""
    if settings.VERI_TINKER_PROVIDER == "local":
        return []
    return [
        checks.Error(
            f"VERI_TINKER_PROVIDER={settings.VERI_TINKER_PROVIDER!r}: Tinker models run only on "
            "the local provider until their uptime is billed.",
            hint="Unset VERI_TINKER_PROVIDER (its default is local).",
            id="tinker_api.E001",
        )
    ]
