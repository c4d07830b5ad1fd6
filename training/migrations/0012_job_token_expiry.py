from datetime import timedelta

import django.db.models.deletion
import django.utils.timezone
from django.conf import settings
from django.db import migrations, models
from django.db.models import F


def expire_from_creation(apps, schema_editor):
    """Tokens minted before tokens expired get the lifetime they would have had."""
    JobToken = apps.get_model("training", "JobToken")
    lifetime = timedelta(seconds=settings.VERI_JOB_TOKEN_TTL_SECONDS)
    JobToken.objects.update(expires_at=F("created_at") + lifetime)


class Migration(migrations.Migration):
    dependencies = [
        ("training", "0011_watchdog_resumed_at"),
    ]

    operations = [
        migrations.AlterField(
            model_name="jobtoken",
            name="job",
            field=models.ForeignKey(
                on_delete=django.db.models.deletion.CASCADE,
                related_name="tokens",
                to="training.trainingjob",
            ),
        ),
        migrations.AddField(
            model_name="jobtoken",
            name="expires_at",
            field=models.DateTimeField(default=django.utils.timezone.now),
            preserve_default=False,
        ),
        migrations.RunPython(expire_from_creation, migrations.RunPython.noop),
    ]
