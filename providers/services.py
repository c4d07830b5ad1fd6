"""Which providers this deployment can use, and their adapters."""

from functools import cache

from django.conf import settings
from django.utils.module_loading import import_string

from providers.base import ProviderAdapter
from providers.catalog import ProviderSpec, providers


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
