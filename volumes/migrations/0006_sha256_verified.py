"""Whether the store checked a file's sha256 (a single PUT signed with it) or took the uploader's
word for it (a multipart upload, whose parts carry only their own MD5s). Files and pins recorded
before are marked from the upload that stored their object."""

from django.db import migrations, models


def mark_verified(apps, schema_editor):
    Upload = apps.get_model("volumes", "Upload")
    signed = (
        Upload.objects.filter(method="single", status="completed")
        .exclude(sha256="")
        .values("object_key")
    )
    for name in ("VolumeFile", "PinnedFile"):
        model = apps.get_model("volumes", name)
        model.objects.filter(object_key__in=signed).exclude(sha256="").update(sha256_verified=True)


class Migration(migrations.Migration):
    dependencies = [
        ("volumes", "0005_paths_in_one_spelling"),
    ]

    operations = [
        migrations.AddField(
            model_name="pinnedfile",
            name="sha256_verified",
            field=models.BooleanField(default=False),
        ),
        migrations.AddField(
            model_name="volumefile",
            name="sha256_verified",
            field=models.BooleanField(default=False),
        ),
        migrations.RunPython(mark_verified, migrations.RunPython.noop),
    ]
