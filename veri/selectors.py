"""Reads of the tenancy core, always within one workspace."""

from django.db.models import QuerySet

from veri.errors import NotFound
from veri.models import ApiKey, Workspace


def list_api_keys(*, workspace: Workspace) -> QuerySet[ApiKey]:
    return ApiKey.objects.filter(workspace=workspace).order_by("-pk")


def get_api_key(*, workspace: Workspace, prefix: str) -> ApiKey:
    key = list_api_keys(workspace=workspace).filter(prefix=prefix).first()
    if key is None:
        raise NotFound(f"No API key {prefix!r} in this workspace.")
    return key
