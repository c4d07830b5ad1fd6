import hashlib
import hmac
import re
import secrets
from datetime import timedelta

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.core.validators import validate_email
from django.db import IntegrityError, transaction
from django.utils import timezone

from veri import sealing
from veri.errors import Conflict, NotFound, VeriError
from veri.models import ApiKey, Membership, Workspace, WorkspaceSecret

KEY_PREFIX = "veri_sk_"
MAX_SECRET_CHARS = 4096
# last_used_at is informational: writing it on every request would turn reads into writes.
LAST_USED_RESOLUTION = timedelta(minutes=1)


def hash_secret(secret: str) -> str:
    # The secret is 256 random bits, so a plain digest cannot be brute-forced; no slow KDF needed.
    return hashlib.sha256(secret.encode()).hexdigest()


@transaction.atomic
def create_workspace(*, name: str) -> tuple[Workspace, str]:
    """A workspace and its first API key; the key is returned once and never stored. Names are
    unique: a taken one is 409 `workspace_exists` (the constraint decides, also under races)."""
    if not isinstance(name, str) or not 1 <= len(name.strip()) <= 200 or not name.isprintable():
        raise VeriError(
            "A workspace name is 1 to 200 printable characters.", field="name", code="invalid_name"
        )
    try:
        with transaction.atomic():
            workspace = Workspace.objects.create(name=name.strip())
    except IntegrityError:
        raise Conflict(
            f"A workspace named {name.strip()!r} already exists; pick another name.",
            field="name",
            code="workspace_exists",
        ) from None
    _, key = create_api_key(workspace=workspace, name="default")
    return workspace, key


def find_user(*, email: str):
    return get_user_model().objects.filter(username=email.strip().lower()).first()


def add_owner(*, workspace: Workspace, email: str, password: str | None) -> tuple[object, bool]:
    """Make the account `email` (created when new, with `password`) an owner of `workspace`.
    Accounts sign in with their email, lower-cased, as the username (veri.auth.EmailBackend)."""
    email = email.strip().lower()
    try:
        validate_email(email)
    except ValidationError:
        raise VeriError(f"{email!r} is not an email address.", field="owner") from None
    user = find_user(email=email)
    created = user is None
    if created:
        if not password:
            raise VeriError("A new owner needs a password.", field="password")
        try:
            validate_password(password)
        except ValidationError as exc:
            raise VeriError(" ".join(exc.messages), field="password") from None
        user = get_user_model().objects.create_user(username=email, email=email, password=password)
    Membership.objects.update_or_create(
        workspace=workspace, user=user, defaults={"role": Membership.Role.OWNER}
    )
    return user, created


def issue_key(model, *, workspace: Workspace, name: str, key_prefix: str) -> tuple:
    """A key row of `model` (an API key, or a face's key such as a Tinker key) and the key
    itself, `<key_prefix><prefix>_<secret>`, shown this once: only the secret's hash is kept."""
    prefix, secret = secrets.token_hex(4), secrets.token_hex(32)
    key = model.objects.create(
        workspace=workspace, name=name, prefix=prefix, secret_hash=hash_secret(secret)
    )
    return key, f"{key_prefix}{prefix}_{secret}"


def revoke_key(key) -> None:
    type(key).objects.filter(pk=key.pk, revoked_at__isnull=True).update(revoked_at=timezone.now())


def active_key(model, *, raw: str, key_prefix: str):
    """The active key row of `model` for `<key_prefix><prefix>_<secret>`, or None for anything
    else."""
    if not raw.startswith(key_prefix):
        return None
    prefix, _, secret = raw[len(key_prefix) :].partition("_")
    if not prefix or not secret:
        return None
    key = (
        model.objects.select_related("workspace")
        .filter(prefix=prefix, revoked_at__isnull=True)
        .first()
    )
    if key is None or not hmac.compare_digest(key.secret_hash, hash_secret(secret)):
        return None
    now = timezone.now()
    if key.last_used_at is None or now - key.last_used_at > LAST_USED_RESOLUTION:
        model.objects.filter(pk=key.pk).update(last_used_at=now)
        key.last_used_at = now
    return key


def create_api_key(*, workspace: Workspace, name: str = "") -> tuple[ApiKey, str]:
    return issue_key(ApiKey, workspace=workspace, name=name, key_prefix=KEY_PREFIX)


def revoke_api_key(*, api_key: ApiKey) -> None:
    revoke_key(api_key)


def authenticate_api_key(*, raw_key: str) -> ApiKey | None:
    """The active key for `veri_sk_<prefix>_<secret>`, or None for anything else."""
    return active_key(ApiKey, raw=raw_key, key_prefix=KEY_PREFIX)


def deployment_id() -> str:
    """Tells this deployment from another Veri on the same address (a stale clone on :8000):
    derived from SECRET_KEY, revealing nothing of it."""
    return hmac.new(settings.SECRET_KEY.encode(), b"veri-deployment", hashlib.sha256).hexdigest()[
        :16
    ]


def check_secret_name(name: str) -> None:
    if not isinstance(name, str) or not re.fullmatch(WorkspaceSecret.NAME_PATTERN, name):
        raise VeriError(
            "A secret's name is 1 to 64 upper-case letters, digits and underscores, starting "
            "with a letter (e.g. WANDB_API_KEY).",
            field="name",
            code="invalid_secret_name",
        )


@transaction.atomic
def set_secret(*, workspace: Workspace, name: str, value: str) -> tuple[WorkspaceSecret, bool]:
    """Create or replace the workspace's secret `name`; True when it is new. The value is
    sealed before it is written and never returned."""
    check_secret_name(name)
    if not isinstance(value, str) or not 1 <= len(value) <= MAX_SECRET_CHARS or "\x00" in value:
        raise VeriError(
            f"A secret's value is 1 to {MAX_SECRET_CHARS} characters, without NUL.",
            field="value",
        )
    unsaved = WorkspaceSecret(workspace=workspace, name=name)
    sealed = sealing.seal(
        value.encode(), purpose=WorkspaceSecret.SEALING_PURPOSE, context=unsaved.sealing_context
    )
    return WorkspaceSecret.objects.update_or_create(
        workspace=workspace, name=name, defaults={"sealed_value": sealed}
    )


def delete_secret(*, workspace: Workspace, name: str) -> None:
    deleted, _ = WorkspaceSecret.objects.filter(workspace=workspace, name=name).delete()
    if not deleted:
        raise NotFound(f"No secret {name!r} in this workspace.")
