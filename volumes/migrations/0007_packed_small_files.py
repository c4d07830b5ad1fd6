"""Small files uploaded together as one object (a pack): each file, upload and pin records where its
bytes start in that object (existing rows each hold an object of their own: None). Object keys are
indexed: the reconciler asks whether any file or upload still holds a pack. A deletion whose key an
upload URL could still create again is repeated once that URL has expired (`not_before`)."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("volumes", "0006_sha256_verified"),
    ]

    operations = [
        migrations.AddField(
            model_name="pinnedfile",
            name="offset",
            field=models.PositiveBigIntegerField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="storedeletion",
            name="not_before",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="upload",
            name="offset",
            field=models.PositiveBigIntegerField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="volumefile",
            name="offset",
            field=models.PositiveBigIntegerField(blank=True, null=True),
        ),
        migrations.AlterField(
            model_name="upload",
            name="method",
            field=models.CharField(
                choices=[("single", "Single"), ("multipart", "Multipart"), ("packed", "Packed")],
                max_length=10,
            ),
        ),
        migrations.AlterField(
            model_name="upload",
            name="object_key",
            field=models.CharField(db_index=True, max_length=1024),
        ),
        migrations.AlterField(
            model_name="volumefile",
            name="object_key",
            field=models.CharField(db_index=True, max_length=1024),
        ),
    ]
