"""Tinker keys: `tml-<prefix>_<secret>`, what the `tinker` client accepts as an API key (it
requires the `tml-` prefix), mapped to a workspace with the same reach as a Veri API key."""

import hmac
import secrets

from django.utils import timezone

from tinker_api.models import TinkerKey
from veri.models import Workspace
from veri.services import LAST_USED_RESOLUTION, hash_secret

KEY_PREFIX = "tml-"


def create_key(*, workspace: Workspace, name: str = "") -> tuple[TinkerKey, str]:
    """The key's row and the key itself, shown this once (only its hash is kept)."""
    prefix, secret = secrets.token_hex(4), secrets.token_hex(32)
    key = TinkerKey.objects.create(
        workspace=workspace, name=name, prefix=prefix, secret_hash=hash_secret(secret)
    )
    return key, f"{KEY_PREFIX}{prefix}_{secret}"


def revoke_key(*, key: TinkerKey) -> None:
    TinkerKey.objects.filter(pk=key.pk, revoked_at__isnull=True).update(revoked_at=timezone.now())


def authenticate_key(*, raw: str) -> TinkerKey | None:
    """The active key for `tml-<prefix>_<secret>`, or None for anything else."""
    if not raw.startswith(KEY_PREFIX):
        return None
    prefix, _, secret = raw[len(KEY_PREFIX) :].partition("_")
    if not prefix or not secret:
        return None
    key = (
        TinkerKey.objects.select_related("workspace")
        .filter(prefix=prefix, revoked_at__isnull=True)
        .first()
    )
    if key is None or not hmac.compare_digest(key.secret_hash, hash_secret(secret)):
        return None
    now = timezone.now()
    if key.last_used_at is None or now - key.last_used_at > LAST_USED_RESOLUTION:
        TinkerKey.objects.filter(pk=key.pk).update(last_used_at=now)
    return key
