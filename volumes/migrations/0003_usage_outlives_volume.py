import django.db.models.deletion
from django.db import migrations, models


def fill_volume_ref(apps, schema_editor):
    UsageSnapshot = apps.get_model("volumes", "UsageSnapshot")
    for snapshot in UsageSnapshot.objects.select_related("volume").iterator():
        UsageSnapshot.objects.filter(pk=snapshot.pk).update(volume_ref=snapshot.volume.public_id)


class Migration(migrations.Migration):
    dependencies = [("volumes", "0002_schedules")]

    operations = [
        migrations.AddField(
            model_name="usagesnapshot",
            name="volume_ref",
            field=models.CharField(default="", max_length=40),
            preserve_default=False,
        ),
        migrations.RunPython(fill_volume_ref, migrations.RunPython.noop),
        migrations.RemoveConstraint(model_name="usagesnapshot", name="one_snapshot_per_hour"),
        migrations.AlterField(
            model_name="usagesnapshot",
            name="volume",
            field=models.ForeignKey(
                null=True,
                on_delete=django.db.models.deletion.SET_NULL,
                related_name="usage_snapshots",
                to="volumes.volume",
            ),
        ),
        migrations.AddConstraint(
            model_name="usagesnapshot",
            constraint=models.UniqueConstraint(
                fields=("volume_ref", "hour"), name="one_snapshot_per_hour"
            ),
        ),
    ]
