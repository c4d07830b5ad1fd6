"""Every state change of volumes: create, delete, and the upload lifecycle."""

import hashlib
import math
import re
import secrets
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass, replace

from django.conf import settings
from django.db import transaction
from django.db.models import F, Max
from django.utils import timezone

from veri.errors import Conflict, NotFound, TooLarge, VeriError
from veri.models import Workspace
from veri.queue import enqueue_on_commit
from veri.regions import available_region_codes, default_region
from volumes.models import PinnedFile, StoreDeletion, Upload, UsageSnapshot, Volume, VolumeFile
from volumes.stores import StoreError, StoreUnavailable, keys, store_for

NAME_RE = re.compile(r"[a-zA-Z0-9][a-zA-Z0-9_-]{0,127}")
MAX_PARTS = 10_000  # S3's limit
MAX_OBJECT_BYTES = 5 * 1024**4  # S3's largest object
MIN_PART_SIZE = 5 * 1024**2  # S3's minimum for every part but the last
SHA256_RE = re.compile(r"[0-9a-f]{64}")
# Small files may travel in packs (one PUT for many; see `start_packed_uploads`). A pack is read
# back whole when it completes, to check each file's sha256, so it stays small.
PACK_FILE_MAX_BYTES = 1024**2
PACK_MAX_BYTES = 16 * 1024**2


def validate_volume_name(name: str, *, field: str = "name") -> None:
    if not isinstance(name, str) or not NAME_RE.fullmatch(name):
        shown = name[:200] if isinstance(name, str) else name
        raise VeriError(
            f"Volume names are 1-128 characters of letters, digits, '_' and '-', starting with a "
            f"letter or digit (^[a-zA-Z0-9][a-zA-Z0-9_-]{{0,127}}$); got {shown!r}.",
            field=field,
            code="invalid_name",
        )


def validate_path(path: str, *, field: str = "path") -> str:
    """The one rule for every path a customer or a worker sends (`keys.path_problem`): relative
    POSIX, no `.`/`..`/empty segments, no control characters or backslashes, also once
    percent-decoded, and short enough to be a key. Returns the path's one spelling, Unicode NFC:
    `café` typed on a Mac arrives decomposed (NFD) and must name the same file as `café` typed
    elsewhere, not a second file that looks identical."""
    if isinstance(path, str):
        path = unicodedata.normalize("NFC", path)
    if problem := keys.path_problem(path):
        shown = path if isinstance(path, str) and len(path) <= 200 else f"{str(path)[:200]}…"
        raise VeriError(
            f"File paths are relative POSIX paths like 'data/train.jsonl'; {shown!r} is refused "
            f"because {problem}.",
            field=field,
            code="invalid_path",
        )
    return path


def validate_prefix(prefix: str, *, field: str = "prefix") -> str:
    """The start of a path (a folder may end in `/`), held to the path rules and spelled as
    `validate_path` spells paths; "" is every path."""
    if not prefix:
        return ""
    folder = prefix.endswith("/")
    return validate_path(prefix.removesuffix("/") if folder else prefix, field=field) + (
        "/" if folder else ""
    )


def schedule_store_deletion(*, prefix: keys.Prefix | None = None, key: str = "", reason: str):
    """Queue objects the database no longer points to for the reconciler (a folder, or one key)."""
    return StoreDeletion.objects.create(key=prefix.value if prefix else key, reason=reason)


def pin_files(*, holder: str, volumes: Sequence[Volume]) -> str:
    """Pin every file of `volumes` as it is now for `holder`; returns the manifest's digest (the
    sha256 of each file's volume, path, size and sha256, in order)."""
    rows = list(
        VolumeFile.objects.filter(volume__in=volumes)
        .order_by("volume_id", "path")
        .values("volume_id", "path", "size", "sha256", "sha256_verified", "object_key", "offset")
    )
    PinnedFile.objects.bulk_create(PinnedFile(holder=holder, **row) for row in rows)
    ids = {v.pk: v.public_id for v in volumes}
    manifest = hashlib.sha256()
    for row in rows:
        manifest.update(f"{ids[row['volume_id']]}\t{row['path']}\t{row['size']}\t".encode())
        manifest.update(f"{row['sha256']}\n".encode())
    return manifest.hexdigest()


def release_pins(*, holder: str) -> None:
    """The holder is done: its pinned objects replaced meanwhile may now leave the store."""
    PinnedFile.objects.filter(holder=holder).delete()


def create_volume(
    *, workspace: Workspace, name: str, region: str | None = None
) -> tuple[Volume, bool]:
    """Same name returns the existing volume, even under a race: the unique constraint decides."""
    validate_volume_name(name)
    region = region or default_region()
    if region not in available_region_codes():
        raise VeriError(
            f"Unknown or not yet available region {region!r}; use one of: "
            f"{', '.join(available_region_codes())}.",
            field="region",
            code="invalid_region",
        )
    # get_or_create retries the get after an IntegrityError, so concurrent creates meet on one row.
    return Volume.objects.get_or_create(workspace=workspace, name=name, defaults={"region": region})


@transaction.atomic
def delete_volume(*, volume: Volume, confirm: str | None = None, force: bool = False) -> None:
    """The row goes now; the reconciler empties its store prefix (queued now, and each minute)."""
    if not force and confirm != volume.name:
        raise VeriError(
            f"Deleting volume {volume.name!r} removes {volume.file_count} files "
            f"({volume.total_bytes} bytes). Confirm with confirm={volume.name}.",
            field="confirm",
            code="confirmation_required",
            file_count=volume.file_count,
            total_bytes=volume.total_bytes,
        )
    schedule_store_deletion(
        prefix=volume.store_prefix, reason=f"volume {volume.public_id} ({volume.name}) deleted"
    )
    volume.delete()
    enqueue_on_commit("volumes.tasks.reconcile_deleted_volumes")


@dataclass(frozen=True, slots=True)
class FileToUpload:
    path: str
    size: int
    sha256: str = ""


def _validate_file(file: FileToUpload, *, field_prefix: str = "") -> FileToUpload:
    """The file as it will be recorded (its path in its one spelling), or a 400."""
    file = replace(file, path=validate_path(file.path, field=f"{field_prefix}path"))
    if not isinstance(file.size, int) or file.size < 0:
        raise VeriError(
            "size must be a whole number of bytes, 0 or more.", field=f"{field_prefix}size"
        )
    if file.size > MAX_OBJECT_BYTES:
        raise TooLarge(
            f"{file.path}: {file.size} bytes is more than the store takes in one file "
            f"({MAX_OBJECT_BYTES} bytes, 5 TiB); split it.",
            field=f"{field_prefix}size",
            code="file_too_large",
        )
    if file.sha256 and not SHA256_RE.fullmatch(file.sha256):
        raise VeriError(
            "sha256 must be 64 lowercase hex characters.",
            field=f"{field_prefix}sha256",
            code="invalid_sha256",
        )
    return file


def part_size_for(size: int) -> int:
    return max(settings.VERI_MULTIPART_PART_SIZE, MIN_PART_SIZE, math.ceil(size / MAX_PARTS))


def _instructions(upload: Upload, pack_index: dict[str, int]) -> dict:
    """What the client needs to send the bytes: one URL, one URL per part, or where in which pack
    of the answer they go."""
    store, ttl = store_for(upload.volume.store_prefix), settings.VERI_PRESIGN_TTL_SECONDS
    answer = {"upload_id": upload.public_id, "path": upload.path, "method": upload.method}
    if upload.method == Upload.Method.PACKED:
        answer |= {"pack": pack_index[upload.object_key], "offset": upload.offset}
    elif upload.method == Upload.Method.SINGLE:
        # Create-only: once the object is there (and completing checked it), re-sending this URL
        # with other bytes is refused instead of changing a file already recorded. Each upload
        # has a key of its own, so this never stands in the way of a new upload of the path.
        answer["url"], answer["headers"] = store.presign_put(
            upload.object_key, expires=ttl, sha256=upload.sha256 or None, create_only=True
        )
    else:
        count = max(1, math.ceil(upload.size / upload.part_size))
        answer["part_size"] = upload.part_size
        answer["parts"] = [
            {
                "number": n,
                "url": store.presign_part(
                    upload.object_key, upload_id=upload.store_upload_id, number=n, expires=ttl
                ),
            }
            for n in range(1, count + 1)
        ]
    return answer


def start_uploads(*, volume: Volume, files: Sequence[FileToUpload]) -> list[dict]:
    """One answer per file: upload instructions, or `{"path", "skipped": True}` when a file with the
    same size and sha256 is already stored at that path."""
    return _start_uploads(volume=volume, files=files, pack=False)[0]


def start_packed_uploads(
    *, volume: Volume, files: Sequence[FileToUpload]
) -> tuple[list[dict], list[dict]]:
    """As `start_uploads`, but the small files announced with a sha256 go in packs: each pack is
    one object the client sends as one PUT (its files' bytes one after another, in the order
    announced), so a thousand small files cost a few requests, not a thousand. Returns the
    answers and the packs (`{"url", "headers", "size"}`); a packed file's answer names its pack
    by index and where its bytes start in it."""
    return _start_uploads(volume=volume, files=files, pack=True)


def _start_uploads(
    *, volume: Volume, files: Sequence[FileToUpload], pack: bool
) -> tuple[list[dict], list[dict]]:
    seen: set[str] = set()
    files = [
        _validate_file(file, field_prefix=f"files.{index}." if len(files) > 1 else "")
        for index, file in enumerate(files)
    ]
    for index, file in enumerate(files):
        # One batch's uploads share a folder: two of one path would be one object, which the
        # first completion keeps and the second deletes as replaced. Two spellings of one name
        # (NFC and NFD) are one path by now.
        if file.path in seen:
            raise VeriError(
                f"{file.path} is in this batch twice (perhaps spelt two ways); send each path "
                "once.",
                field=f"files.{index}.path",
                code="duplicate_path",
            )
        seen.add(file.path)
    threshold = settings.VERI_MULTIPART_THRESHOLD
    part_urls = sum(math.ceil(f.size / part_size_for(f.size)) for f in files if f.size > threshold)
    # One file may take S3's whole 10,000 parts; a batch past that would be minutes of signing
    # and an answer of many megabytes.
    if len(files) > 1 and part_urls > MAX_PARTS:
        raise TooLarge(
            f"This batch needs {part_urls} part URLs, more than {MAX_PARTS} in one answer: send "
            "its large files on their own (POST /v1/volumes/{volume_id}/files) or fewer at once.",
            field="files",
            code="batch_too_large",
        )
    stored = {
        f.path: f
        for f in VolumeFile.objects.filter(volume=volume, path__in=[f.path for f in files])
    }
    # One folder per batch, so completing it is one store listing; its packs have their own
    # (no file path can name them).
    batch = secrets.token_hex(8)
    batch_folder = volume.store_prefix.child(batch)
    packs_folder = volume.store_prefix.child(f"packs/{batch}")
    store = store_for(volume.store_prefix)
    answers: list[dict | None] = []
    new_uploads, packs = [], []
    for file in files:
        existing = stored.get(file.path)
        if (
            file.sha256
            and existing
            and (existing.size, existing.sha256) == (file.size, file.sha256)
        ):
            answers.append({"path": file.path, "skipped": True})
            continue
        upload = Upload(
            volume=volume,
            path=file.path,
            size=file.size,
            sha256=file.sha256,
            object_key=batch_folder.key(file.path),
            method=Upload.Method.MULTIPART if file.size > threshold else Upload.Method.SINGLE,
        )
        if pack and file.sha256 and 0 < file.size <= PACK_FILE_MAX_BYTES:
            if not packs or packs[-1]["size"] + file.size > PACK_MAX_BYTES:
                packs.append({"key": packs_folder.key(str(len(packs))), "size": 0})
            upload.method, upload.object_key = Upload.Method.PACKED, packs[-1]["key"]
            upload.offset = packs[-1]["size"]
            packs[-1]["size"] += file.size
        if upload.method == Upload.Method.MULTIPART:
            upload.part_size = part_size_for(file.size)
            upload.store_upload_id = store.create_multipart(upload.object_key)
        new_uploads.append(upload)
        answers.append(None)
    Upload.objects.bulk_create(new_uploads)
    pack_index = {p["key"]: index for index, p in enumerate(packs)}
    instructions = iter(_instructions(upload, pack_index) for upload in new_uploads)
    ttl = settings.VERI_PRESIGN_TTL_SECONDS
    signed = []
    for p in packs:
        # Create-only like a single file's URL; the content is checked when the pack completes.
        url, headers = store.presign_put(p["key"], expires=ttl, create_only=True)
        signed.append({"url": url, "headers": headers, "size": p["size"]})
    return [answer or next(instructions) for answer in answers], signed


@dataclass(frozen=True, slots=True)
class Completion:
    upload: Upload
    parts: list[tuple[int, str]] | None = None


def _check_stored(upload: Upload, stored) -> str | None:
    """Why the stored object does not match what the client announced, or None when it does."""
    if stored is None:
        return f"{upload.path}: nothing was uploaded (expected {upload.size} bytes)"
    if stored.size != upload.size:
        return f"{upload.path}: the store holds {stored.size} bytes, expected {upload.size}"
    return None


def complete_uploads(
    *, volume: Volume, completions: Sequence[Completion]
) -> list[VolumeFile | VeriError]:
    """Finish uploads: check each stored object's size and record the file.

    The content was checked by the store as it arrived: a single PUT announced with a sha256 is
    signed with it, and the store refuses other bytes (so nothing is read back here, which would
    cost a GET per file and minutes for large ones); multipart parts carry their Content-MD5.
    A pack is small: it is read back once and each of its files hashed (`_check_packs`).
    A mismatch records nothing (the answer is an `upload_incomplete` error) and leaves the file
    already stored at that path untouched. Completing twice returns the same file.
    """
    store = store_for(volume.store_prefix)
    store_errors: dict[int, str] = {}
    pending = [c for c in completions if c.upload.status == Upload.Status.PENDING]
    for completion in pending:
        upload = completion.upload
        if upload.method == Upload.Method.MULTIPART:
            try:
                store.complete_multipart(
                    upload.object_key,
                    upload_id=upload.store_upload_id,
                    parts=completion.parts or [],
                )
            except StoreUnavailable:
                raise  # nothing is decided while the store is away: 503, and the client retries
            except StoreError as exc:
                store_errors[upload.pk] = (
                    f"{upload.path}: the multipart upload could not be completed ({exc})"
                )
    packed = [c.upload for c in pending if c.upload.method == Upload.Method.PACKED]
    own = [c.upload for c in pending if c.upload.method != Upload.Method.PACKED]
    stored = store.stat_many([u.object_key for u in own if u.pk not in store_errors])
    problems = {
        u.pk: store_errors.get(u.pk) or _check_stored(u, stored.get(u.object_key)) for u in own
    } | _check_packs(store, packed)
    _record_completions(volume=volume, pending=[c.upload for c in pending], problems=problems)

    keys = [c.upload.object_key for c in completions]
    files = {
        (f.object_key, f.offset): f
        for f in VolumeFile.objects.filter(volume=volume, object_key__in=keys)
    }
    statuses = dict(
        Upload.objects.filter(pk__in=[c.upload.pk for c in completions]).values_list("pk", "status")
    )
    results: list[VolumeFile | VeriError] = []
    for completion in completions:
        upload = completion.upload
        upload.status = statuses[upload.pk]
        if upload.status == Upload.Status.COMPLETED:
            results.append(
                files.get((upload.object_key, upload.offset))
                or Conflict(
                    f"{upload.path}: a newer upload replaced this one.",
                    code="upload_superseded",
                    upload_id=upload.public_id,
                )
            )
        elif problems.get(upload.pk):
            results.append(
                VeriError(problems[upload.pk], code="upload_incomplete", upload_id=upload.public_id)
            )
        else:
            results.append(
                Conflict(
                    f"{upload.path}: this upload was aborted.",
                    code="upload_aborted",
                    upload_id=upload.public_id,
                )
            )
    return results


def _check_packs(store, uploads: list[Upload]) -> dict[int, str | None]:
    """Why each packed upload's bytes are not what was announced, or None when they are: its pack
    must be as long as all its files together (the answer to the batch said so), and the file's
    slice of it must hash to the file's sha256. Each pack is read once, from its first file being
    completed to its last: completing a pack's files one call each reads it once in all."""
    if not uploads:
        return {}
    packs: dict[str, list[Upload]] = {}
    for upload in uploads:
        packs.setdefault(upload.object_key, []).append(upload)
    expected = dict(
        Upload.objects.filter(object_key__in=packs)
        .values("object_key")
        .annotate(end=Max(F("offset") + F("size")))
        .values_list("object_key", "end")
    )
    stored, problems = store.stat_many(list(packs)), {}
    for key, members in packs.items():
        found = stored.get(key)
        if found is None or found.size != expected[key]:
            why = (
                "nothing was uploaded"
                if found is None
                else f"its pack holds {found.size} bytes, expected {expected[key]}"
            )
            problems |= {u.pk: f"{u.path}: {why}" for u in members}
            continue
        first = min(u.offset for u in members)
        span = (first, max(u.offset + u.size for u in members) - 1)
        try:
            data = memoryview(store.get_bytes(key, byte_range=span))
        except StoreUnavailable:
            raise
        except StoreError as exc:
            problems |= {u.pk: f"{u.path}: its pack could not be read ({exc})" for u in members}
            continue
        for u in members:
            digest = hashlib.sha256(data[u.offset - first : u.offset - first + u.size]).hexdigest()
            problems[u.pk] = (
                None if digest == u.sha256 else f"{u.path}: the bytes sent differ from its sha256"
            )
    return problems


@transaction.atomic
def _record_completions(
    *, volume: Volume, pending: list[Upload], problems: dict[int, str | None]
) -> None:
    # The volume's row lock serializes every completion into it, which keeps the counters exact.
    if Volume.objects.select_for_update().filter(pk=volume.pk).first() is None:
        raise NotFound(f"No volume {volume.public_id} in this workspace.")
    still_pending = {
        u.pk: u
        for u in Upload.objects.select_for_update()
        .filter(pk__in=[u.pk for u in pending], status=Upload.Status.PENDING)
        .order_by("pk")
    }
    now = timezone.now()
    good = [u for u in still_pending.values() if not problems[u.pk]]
    bad = [u for u in still_pending.values() if problems[u.pk]]
    # Within one batch the last upload of a path wins; earlier ones count as replaced.
    newest = {u.path: u for u in good}
    existing = {f.path: f for f in VolumeFile.objects.filter(volume=volume, path__in=newest)}
    obsolete_keys = [u.object_key for u in good if newest[u.path] is not u] + [
        u.object_key for u in bad
    ]
    created, updated, added_files, added_bytes = [], [], 0, 0
    for path, upload in newest.items():
        fields = {
            "size": upload.size,
            "sha256": upload.sha256,
            # A single PUT's the store checked; a pack's, `_check_packs`.
            "sha256_verified": bool(upload.sha256) and upload.method != Upload.Method.MULTIPART,
            "object_key": upload.object_key,
            "offset": upload.offset,
            "uploaded_at": now,
        }
        if file := existing.get(path):
            obsolete_keys.append(file.object_key)
            added_bytes += upload.size - file.size
            for name, value in fields.items():
                setattr(file, name, value)
            updated.append(file)
        else:
            created.append(VolumeFile(volume=volume, path=path, **fields))
            added_files += 1
            added_bytes += upload.size
    VolumeFile.objects.bulk_create(created)
    VolumeFile.objects.bulk_update(
        updated, ["size", "sha256", "sha256_verified", "object_key", "offset", "uploaded_at"]
    )
    Volume.objects.filter(pk=volume.pk).update(
        file_count=F("file_count") + added_files, total_bytes=F("total_bytes") + added_bytes
    )
    for status, uploads in ((Upload.Status.COMPLETED, good), (Upload.Status.ABORTED, bad)):
        Upload.objects.filter(pk__in=[u.pk for u in uploads]).update(status=status, finished_at=now)
    live = {upload.object_key for upload in newest.values()}  # never delete what a file holds
    StoreDeletion.objects.bulk_create(
        StoreDeletion(key=key, reason="replaced or rejected upload")
        for key in dict.fromkeys(obsolete_keys)  # a pack's files share one key
        if key not in live
    )
    volume.refresh_from_db(fields=["file_count", "total_bytes"])
    record_usage(volume=volume)


def record_usage(*, volume: Volume) -> None:
    """This hour's usage snapshot says what the volume holds now, so its chart is right from the
    first file (the hourly run only adds the hours no change wrote). Called under the volume's
    row lock, where its counters are exact."""
    UsageSnapshot.objects.update_or_create(
        volume_ref=volume.public_id,
        hour=timezone.now().replace(minute=0, second=0, microsecond=0),
        defaults={
            "volume": volume,
            "workspace_id": volume.workspace_id,
            "file_count": volume.file_count,
            "total_bytes": volume.total_bytes,
        },
    )


def abort_upload(*, upload: Upload) -> Upload:
    """Stop an upload; its bytes (and any multipart parts) are removed from the store."""
    with transaction.atomic():
        locked = Upload.objects.select_for_update().get(pk=upload.pk)
        if locked.status == Upload.Status.COMPLETED:
            raise Conflict(
                f"{locked.path}: this upload is already complete.", code="upload_completed"
            )
        if locked.status == Upload.Status.ABORTED:
            return locked
        locked.status, locked.finished_at = Upload.Status.ABORTED, timezone.now()
        locked.save(update_fields=["status", "finished_at"])
        schedule_store_deletion(key=locked.object_key, reason="aborted upload")
    if locked.method == Upload.Method.MULTIPART:
        store_for(upload.volume.store_prefix).abort_multipart(
            locked.object_key, upload_id=locked.store_upload_id
        )
    return locked
