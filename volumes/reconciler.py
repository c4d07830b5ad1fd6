"""The store's upkeep, as services: removing what the database dropped, aborting abandoned
uploads, the hourly usage snapshots. Each is idempotent and safe when two runs overlap;
`volumes.tasks` runs them on django-q2's schedules."""

import logging
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Count, F, Max, Q
from django.utils import timezone

from volumes.models import (
    PinnedFile,
    StoreDeletion,
    Upload,
    UsageSnapshot,
    Volume,
    VolumeFile,
)
from volumes.stores import keys, store_for

log = logging.getLogger(__name__)
SWEEP_LIMIT = 200  # rows claimed per run; the schedule comes back for the rest


def reconcile_deleted_volumes() -> int:
    """Remove from the store what the database dropped: deleted volumes' prefixes, replaced files.

    Rows are claimed with SKIP LOCKED, so two runs never work on the same prefix; deleting an
    already-deleted prefix is harmless, so a crash between delete and mark only repeats work.
    """
    store, done = store_for(keys.ALL_WORKSPACES), 0
    while True:
        with transaction.atomic():
            now = timezone.now()
            pending = list(
                StoreDeletion.objects.select_for_update(skip_locked=True)
                .filter(Q(not_before__isnull=True) | Q(not_before__lte=now), done_at__isnull=True)
                .order_by("pk")[:SWEEP_LIMIT]
            )
            if not pending:
                return done
            # A replaced file that a running job pinned stays until the job lets go of it.
            named = [d.key for d in pending]
            pinned = set(
                PinnedFile.objects.filter(object_key__in=named).values_list("object_key", flat=True)
            )
            # A pack whose other files are on their way or stored stays: the upload that replaces
            # or drops the last of them schedules it again. (Uploads are read first: one that
            # completes between the two reads is then seen as pending or as a file.)
            # And until its upload's URL expires, a key deleted now can be created again with it.
            uploads = list(
                Upload.objects.filter(object_key__in=named)
                .values("object_key")
                .annotate(
                    started=Max("created_at"),
                    pending=Count("pk", filter=Q(status=Upload.Status.PENDING)),
                )
            )
            in_use = {u["object_key"] for u in uploads if u["pending"]}
            in_use |= set(
                VolumeFile.objects.filter(object_key__in=named).values_list("object_key", flat=True)
            )
            ttl = timedelta(seconds=settings.VERI_PRESIGN_TTL_SECONDS)
            writable_until = {u["object_key"]: u["started"] + ttl for u in uploads}
            for deletion in pending:
                if deletion.key in pinned:
                    continue
                try:
                    if deletion.is_prefix:
                        store.delete_prefix(keys.Prefix(deletion.key))
                    elif deletion.key not in in_use:
                        store.delete([deletion.key])
                        if writable_until.get(deletion.key, now) > now:
                            deletion.not_before = writable_until[deletion.key]
                            deletion.save(update_fields=["not_before"])
                            continue
                except Exception as exc:  # noqa: BLE001 - any store failure: keep the row, retry later
                    log.warning("could not delete %s: %s", deletion.key, exc)
                    StoreDeletion.objects.filter(pk=deletion.pk).update(
                        attempts=F("attempts") + 1, last_error=str(exc)[:2000]
                    )
                    continue
                deletion.done_at = timezone.now()
                deletion.save(update_fields=["done_at"])
                done += 1
            if len(pending) < SWEEP_LIMIT or all(d.done_at is None for d in pending):
                return done


def abort_stale_uploads(*, now: datetime | None = None) -> int:
    """Abort uploads started more than `VERI_STALE_UPLOAD_SECONDS` ago and never completed,
    and multipart uploads in the store that no pending upload row owns."""
    now = now or timezone.now()
    cutoff = now - timedelta(seconds=settings.VERI_STALE_UPLOAD_SECONDS)
    store, aborted, scheduled = store_for(keys.ALL_WORKSPACES), 0, set()
    stale = Upload.objects.filter(status=Upload.Status.PENDING, created_at__lt=cutoff)
    for upload in stale.order_by("pk")[:SWEEP_LIMIT]:
        claimed = Upload.objects.filter(pk=upload.pk, status=Upload.Status.PENDING).update(
            status=Upload.Status.ABORTED, finished_at=now
        )
        if not claimed:
            continue  # completed or aborted meanwhile
        if upload.method == Upload.Method.MULTIPART:
            store.abort_multipart(upload.object_key, upload_id=upload.store_upload_id)
        if upload.object_key not in scheduled:  # a pack's files share one key
            StoreDeletion.objects.create(key=upload.object_key, reason="stale upload aborted")
            scheduled.add(upload.object_key)
        aborted += 1
    owned = set(
        Upload.objects.filter(
            status=Upload.Status.PENDING, method=Upload.Method.MULTIPART
        ).values_list("store_upload_id", flat=True)
    )
    for orphan in store.list_multipart(keys.ALL_WORKSPACES):
        if orphan.upload_id not in owned and orphan.initiated < cutoff:
            store.abort_multipart(orphan.key, upload_id=orphan.upload_id)
            aborted += 1
    return aborted


def take_usage_snapshots(*, now: datetime | None = None) -> int:
    """One snapshot per volume per hour (what storage billing reads); reruns add none."""
    hour = (now or timezone.now()).replace(minute=0, second=0, microsecond=0)
    taken = 0
    volumes = Volume.objects.values_list(
        "pk", "public_id", "workspace_id", "file_count", "total_bytes"
    )
    for volume_id, public_id, workspace_id, file_count, total_bytes in volumes.iterator():
        _, created = UsageSnapshot.objects.get_or_create(
            volume_ref=public_id,
            hour=hour,
            defaults={
                "volume_id": volume_id,
                "workspace_id": workspace_id,
                "file_count": file_count,
                "total_bytes": total_bytes,
            },
        )
        taken += created
    return taken
