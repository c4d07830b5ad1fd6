"""Reads of volumes, always within one workspace: another workspace's volume is simply not found."""

from django.db.models import Q, QuerySet

from veri.errors import NotFound
from veri.models import Workspace
from volumes.models import PinnedFile, Upload, UsageSnapshot, Volume, VolumeFile


def list_volumes(*, workspace: Workspace) -> QuerySet[Volume]:
    return Volume.objects.filter(workspace=workspace).select_related("workspace")


def get_volume(*, workspace: Workspace, id_or_name: str) -> Volume:
    """By public id, else by name (a name may look like an id, so the id is tried first)."""
    found = list(
        list_volumes(workspace=workspace).filter(Q(public_id=id_or_name) | Q(name=id_or_name))[:2]
    )
    by_id = [v for v in found if v.public_id == id_or_name]
    volume = (by_id or found or [None])[0]
    if volume is None:
        raise NotFound(f"No volume {id_or_name!r} in this workspace.")
    return volume


def list_files(*, volume: Volume, prefix: str = "") -> QuerySet[VolumeFile]:
    files = VolumeFile.objects.filter(volume=volume)
    return files.filter(path__startswith=prefix) if prefix else files


def has_files_under(*, volume: Volume, folder: str) -> bool:
    """Whether any file lies under `folder` ("" for anywhere in the volume)."""
    prefix = folder.rstrip("/") + "/" if folder else ""
    return list_files(volume=volume, prefix=prefix).exists()


def get_file(*, volume: Volume, path: str) -> VolumeFile | None:
    return VolumeFile.objects.filter(volume=volume, path=path).first()


def volumes_with_files(
    *, workspace: Workspace, volume_ids: list[str], pinned_by: str | None = None
) -> list[tuple[Volume, list]]:
    """The workspace's volumes among `volume_ids`, each with its files (`path, size, sha256,
    object_key`, and `offset` where the object is a pack; by path): the files `pinned_by` pinned
    when given, else the current ones. Two queries however many volumes. `sha256` is the one the
    store or a pack's completion checked, empty where none did (a multipart upload's): a worker
    that finds other bytes then blames the platform, which an uploader's false sha256 must not be
    able to make it do."""
    volumes = list(list_volumes(workspace=workspace).filter(public_id__in=volume_ids))
    files: dict[int, list] = {v.pk: [] for v in volumes}
    source = PinnedFile.objects.filter(holder=pinned_by) if pinned_by else VolumeFile.objects
    rows = source.filter(volume__in=volumes).order_by("volume_id", "path")
    fields = ("volume_id", "path", "size", "sha256", "sha256_verified", "object_key", "offset")
    for row in rows.values(*fields).iterator():
        if not row.pop("sha256_verified"):
            row["sha256"] = ""
        if row["offset"] is None:  # the object is the file
            del row["offset"]
        files[row.pop("volume_id")].append(row)
    return [(v, files[v.pk]) for v in volumes]


def get_upload(*, volume: Volume, upload_id: str) -> Upload:
    upload = Upload.objects.filter(volume=volume, public_id=upload_id).first()
    if upload is None:
        raise NotFound(f"No upload {upload_id!r} in volume {volume.name!r}.")
    upload.volume = volume
    return upload


def get_uploads(*, volume: Volume, upload_ids: list[str]) -> dict[str, Upload]:
    uploads = list(Upload.objects.filter(volume=volume, public_id__in=upload_ids))
    for upload in uploads:
        upload.volume = volume
    return {u.public_id: u for u in uploads}


def list_usage(*, volume: Volume) -> QuerySet[UsageSnapshot]:
    return UsageSnapshot.objects.filter(volume=volume)
