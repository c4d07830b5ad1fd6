import secrets
from functools import partial

from django.conf import settings
from django.core.serializers.json import DjangoJSONEncoder
from django.db import models
from django.db.models.functions import Lower

ID_ALPHABET = "0123456789abcdefghijklmnopqrstuvwxyz"


def make_public_id(prefix: str) -> str:
    """An opaque id with a type prefix (`vol_…`): 16 random base-36 characters, ~82 bits."""
    return f"{prefix}_" + "".join(secrets.choice(ID_ALPHABET) for _ in range(16))


def public_id_field(prefix: str) -> models.CharField:
    return models.CharField(
        max_length=40, unique=True, editable=False, default=partial(make_public_id, prefix)
    )


class Workspace(models.Model):
    public_id = public_id_field("ws")
    name = models.CharField(max_length=200)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        # `acme` and `ACME` would be two workspaces nobody could tell apart.
        constraints = [models.UniqueConstraint(Lower("name"), name="workspace_name_unique")]

    def __str__(self) -> str:
        return f"{self.name} ({self.public_id})"


class Membership(models.Model):
    class Role(models.TextChoices):
        OWNER = "owner"
        ADMIN = "admin"
        MEMBER = "member"

    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships"
    )
    role = models.CharField(max_length=10, choices=Role.choices, default=Role.MEMBER)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["workspace", "user"], name="one_membership_per_user")
        ]

    def __str__(self) -> str:
        return f"{self.user} in {self.workspace.name} ({self.role})"


class ApiKey(models.Model):
    """`veri_sk_<prefix>_<secret>`: the prefix finds the row, only the secret's hash is kept."""

    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="api_keys")
    name = models.CharField(max_length=100, blank=True)
    prefix = models.CharField(max_length=16, unique=True, editable=False)
    secret_hash = models.CharField(max_length=64, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True, editable=False)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name = "API key"

    def __str__(self) -> str:
        return f"veri_sk_{self.prefix}_…"

    @property
    def is_active(self) -> bool:
        return self.revoked_at is None


class IdempotencyRecord(models.Model):
    """A POST's claim on its `Idempotency-Key` (no `status_code` yet: the work is in progress),
    then its first answer, replayed to its retries."""

    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE)
    key = models.CharField(max_length=255)
    request_fingerprint = models.CharField(max_length=64)
    status_code = models.PositiveSmallIntegerField(null=True)
    body = models.JSONField(null=True, encoder=DjangoJSONEncoder)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["workspace", "key"], name="one_answer_per_key")
        ]

    def __str__(self) -> str:
        return self.key


class WorkspaceSecret(models.Model):
    """A value a workspace gives the platform to use on its behalf (a W&B key), sealed with
    AES-GCM (veri.sealing) and bound to its workspace and name: read back by the platform only,
    never shown again."""

    NAME_PATTERN = r"^[A-Z][A-Z0-9_]{0,63}$"
    SEALING_PURPOSE = "workspace-secret"

    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="secrets")
    name = models.CharField(max_length=64)
    sealed_value = models.BinaryField(editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["workspace", "name"], name="one_secret_per_name")
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def sealing_context(self) -> bytes:
        """What the sealed value is bound to: copied to another row, it no longer opens."""
        return f"{self.workspace_id}:{self.name}".encode()
