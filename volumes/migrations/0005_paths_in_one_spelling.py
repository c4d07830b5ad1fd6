"""File paths recorded before paths were normalised take their one spelling (Unicode NFC).

Where a volume holds a file under both spellings of one name (`café` composed and decomposed),
the newer upload keeps the name, the older one leaves the volume (its object goes to the
reconciler, which keeps it while a job has it pinned) and the volume's counters drop by it.
Pending uploads take the NFC path too, so completing one records the one spelling. Pinned files
keep the paths their job's manifest was made of."""

import unicodedata

from django.db import migrations
from django.db.models import F


def nfc(path: str) -> str:
    return unicodedata.normalize("NFC", path)


def paths_to_nfc(apps, schema_editor):
    Volume = apps.get_model("volumes", "Volume")
    VolumeFile = apps.get_model("volumes", "VolumeFile")
    Upload = apps.get_model("volumes", "Upload")
    StoreDeletion = apps.get_model("volumes", "StoreDeletion")
    # Only a path with a non-ASCII character can be spelt two ways.
    misspelt = [
        f
        for f in VolumeFile.objects.order_by("pk").iterator()
        if not f.path.isascii() and nfc(f.path) != f.path
    ]
    for file in misspelt:
        twin = VolumeFile.objects.filter(volume_id=file.volume_id, path=nfc(file.path)).first()
        if twin is None:
            VolumeFile.objects.filter(pk=file.pk).update(path=nfc(file.path))
            continue
        older, newer = sorted([file, twin], key=lambda f: (f.uploaded_at, f.pk))
        StoreDeletion.objects.create(
            key=older.object_key, reason="a second spelling of the same path (NFC migration)"
        )
        VolumeFile.objects.filter(pk=older.pk).delete()
        if newer.path != nfc(newer.path):
            VolumeFile.objects.filter(pk=newer.pk).update(path=nfc(newer.path))
        Volume.objects.filter(pk=file.volume_id).update(
            file_count=F("file_count") - 1, total_bytes=F("total_bytes") - older.size
        )
    for upload in Upload.objects.filter(status="pending").iterator():
        if not upload.path.isascii() and nfc(upload.path) != upload.path:
            Upload.objects.filter(pk=upload.pk).update(path=nfc(upload.path))


class Migration(migrations.Migration):
    dependencies = [("volumes", "0004_pinned_files")]

    operations = [migrations.RunPython(paths_to_nfc, migrations.RunPython.noop)]
