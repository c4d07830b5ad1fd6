"""Tinker keys: `tml-<prefix>_<secret>`, what the `tinker` client accepts as an API key (it
requires the `tml-` prefix), mapped to a workspace with the same reach as a Veri API key."""

from tinker_api.models import TinkerKey
from veri import services as veri_services
from veri.models import Workspace

KEY_PREFIX = "tml-"


def create_key(*, workspace: Workspace, name: str = "") -> tuple[TinkerKey, str]:
    """The key's row and the key itself, shown this once (only its hash is kept)."""
    return veri_services.issue_key(TinkerKey, workspace=workspace, name=name, key_prefix=KEY_PREFIX)


def revoke_key(*, key: TinkerKey) -> None:
    veri_services.revoke_key(key)


def authenticate_key(*, raw: str) -> TinkerKey | None:
    """The active key for `tml-<prefix>_<secret>`, or None for anything else."""
    return veri_services.active_key(TinkerKey, raw=raw, key_prefix=KEY_PREFIX)
