"""Reads of the tenancy core, always within one workspace."""

from django.db.models import QuerySet

from veri import sealing
from veri.errors import NotFound
from veri.models import ApiKey, Workspace, WorkspaceSecret


def list_api_keys(*, workspace: Workspace) -> QuerySet[ApiKey]:
    return ApiKey.objects.filter(workspace=workspace).order_by("-pk")


def get_api_key(*, workspace: Workspace, prefix: str) -> ApiKey:
    key = list_api_keys(workspace=workspace).filter(prefix=prefix).first()
    if key is None:
        raise NotFound(f"No API key {prefix!r} in this workspace.")
    return key


def list_secrets(*, workspace: Workspace) -> QuerySet[WorkspaceSecret]:
    """The workspace's secrets, by name; their values are never read here."""
    return WorkspaceSecret.objects.filter(workspace=workspace).defer("sealed_value")


def secret_value(*, workspace: Workspace, name: str) -> str | None:
    """The secret's value, opened for the platform to use (a worker's spec), or None."""
    secret = WorkspaceSecret.objects.filter(workspace=workspace, name=name).first()
    if secret is None:
        return None
    plain = sealing.unseal(
        bytes(secret.sealed_value),
        purpose=WorkspaceSecret.SEALING_PURPOSE,
        context=secret.sealing_context,
    )
    return plain.decode()


def has_secret(*, workspace: Workspace, name: str) -> bool:
    return WorkspaceSecret.objects.filter(workspace=workspace, name=name).exists()
