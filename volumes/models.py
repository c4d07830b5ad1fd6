from django.db import models

from veri.models import Workspace, public_id_field
from volumes.stores import keys


class Volume(models.Model):
    class Status(models.TextChoices):
        READY = "ready"

    public_id = public_id_field("vol")
    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="volumes")
    name = models.CharField(max_length=128)
    region = models.CharField(max_length=40)
    status = models.CharField(max_length=20, choices=Status.choices, default=Status.READY)
    # Kept exact by the upload services under a row lock; read-only everywhere else.
    file_count = models.PositiveBigIntegerField(default=0)
    total_bytes = models.PositiveBigIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["workspace", "name"], name="volume_name_unique_in_workspace"
            )
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def store_prefix(self) -> keys.Prefix:
        """All of this volume's objects are under it."""
        return keys.volume_prefix(self.workspace.public_id, self.public_id)


class VolumeFile(models.Model):
    volume = models.ForeignKey(Volume, on_delete=models.CASCADE, related_name="files")
    path = models.CharField(max_length=1024)
    size = models.PositiveBigIntegerField()
    sha256 = models.CharField(max_length=64, blank=True)
    # The store refused any other bytes (a single PUT signed with `sha256`). A multipart upload's
    # parts are checked only against their own MD5s: its `sha256` is the uploader's word.
    sha256_verified = models.BooleanField(default=False)
    object_key = models.CharField(max_length=1024, db_index=True)
    # Where the file's bytes start in its object when that object is a pack of small files sent
    # as one PUT (`Upload.Method.PACKED`); None when the object is the file.
    offset = models.PositiveBigIntegerField(null=True, blank=True)
    uploaded_at = models.DateTimeField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["volume", "path"], name="one_file_per_path")]

    def __str__(self) -> str:
        return self.path

    @property
    def byte_range(self) -> tuple[int, int] | None:
        return byte_range(self.offset, self.size)


def byte_range(offset: int | None, size: int) -> tuple[int, int] | None:
    """A file's first and last byte in its object when that object is a pack; None when the
    object is the file."""
    return None if offset is None else (offset, offset + size - 1)


class Upload(models.Model):
    """One file on its way into a volume. Its object key is its own, so a failed or mismatched
    upload never touches the file already stored at that path."""

    class Method(models.TextChoices):
        SINGLE = "single"
        MULTIPART = "multipart"
        PACKED = "packed"  # one of the small files of a pack, sent together as one PUT

    class Status(models.TextChoices):
        PENDING = "pending"
        COMPLETED = "completed"
        ABORTED = "aborted"

    public_id = public_id_field("upl")
    volume = models.ForeignKey(Volume, on_delete=models.CASCADE, related_name="uploads")
    path = models.CharField(max_length=1024)
    size = models.PositiveBigIntegerField()
    sha256 = models.CharField(max_length=64, blank=True)
    method = models.CharField(max_length=10, choices=Method.choices)
    object_key = models.CharField(max_length=1024, db_index=True)
    offset = models.PositiveBigIntegerField(null=True, blank=True)  # VolumeFile's
    store_upload_id = models.CharField(max_length=1024, blank=True)
    part_size = models.PositiveBigIntegerField(null=True)
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.PENDING)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    finished_at = models.DateTimeField(null=True)

    def __str__(self) -> str:
        return f"{self.path} ({self.status})"


class UsageSnapshot(models.Model):
    """What storage billing reads: one row per volume per hour. Kept when the volume is deleted
    (billing charges the day it was deleted from them), with the volume's id in `volume_ref`."""

    volume = models.ForeignKey(
        Volume, on_delete=models.SET_NULL, null=True, related_name="usage_snapshots"
    )
    volume_ref = models.CharField(max_length=40)
    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE)
    hour = models.DateTimeField()
    file_count = models.PositiveBigIntegerField()
    total_bytes = models.PositiveBigIntegerField()
    taken_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["volume_ref", "hour"], name="one_snapshot_per_hour")
        ]

    def __str__(self) -> str:
        return f"{self.volume_ref} at {self.hour:%Y-%m-%d %H:00}"


class StoreDeletion(models.Model):
    """Objects the database no longer points to, removed from the store by the reconciler.

    A prefix (ending in `/`) is a deleted volume; a plain key is a replaced or rejected file.
    """

    key = models.CharField(max_length=1024)
    reason = models.CharField(max_length=200)
    created_at = models.DateTimeField(auto_now_add=True)
    done_at = models.DateTimeField(null=True, db_index=True)
    # Deleted once, to be deleted again from then on: an upload URL for the key still worked,
    # and a client could have created the object again with it.
    not_before = models.DateTimeField(null=True, blank=True)
    attempts = models.PositiveIntegerField(default=0)
    last_error = models.TextField(blank=True)

    def __str__(self) -> str:
        return self.key

    @property
    def is_prefix(self) -> bool:
        return self.key.endswith("/")


class PinnedFile(models.Model):
    """A volume's file as it was when a holder (a training job) pinned it: the holder reads this
    version whatever is uploaded over the path later, and the reconciler keeps its object in the
    store until the holder lets go. A deleted volume takes its pins with it."""

    holder = models.CharField(max_length=64, db_index=True)  # "job:<public id>"
    volume = models.ForeignKey(Volume, on_delete=models.CASCADE, related_name="pins")
    path = models.CharField(max_length=1024)
    size = models.PositiveBigIntegerField()
    sha256 = models.CharField(max_length=64, blank=True)
    sha256_verified = models.BooleanField(default=False)  # VolumeFile's, as pinned
    object_key = models.CharField(max_length=1024, db_index=True)
    offset = models.PositiveBigIntegerField(null=True, blank=True)  # VolumeFile's

    def __str__(self) -> str:
        return f"{self.holder}: {self.volume_id}/{self.path}"
