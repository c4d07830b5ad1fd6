from django.db import migrations, models
from django.db.models import Count, Sum
from django.db.models.functions import Length


def count_live_logs(apps, schema_editor):
    """Jobs still running when the cap arrives start from what they already have (characters,
    close to bytes for the ASCII most logs are); ended jobs take no more lines anyway."""
    TrainingJob = apps.get_model("training", "TrainingJob")
    LogChunk = apps.get_model("training", "LogChunk")
    live = TrainingJob.objects.exclude(status__in=["completed", "failed", "cancelled"])
    for job_id in list(live.values_list("pk", flat=True)):
        kept = LogChunk.objects.filter(job_id=job_id).aggregate(
            chars=Sum(Length("text")), lines=Count("pk")
        )
        TrainingJob.objects.filter(pk=job_id).update(
            log_bytes=(kept["chars"] or 0) + kept["lines"]
        )


class Migration(migrations.Migration):
    dependencies = [
        ("training", "0012_job_token_expiry"),
    ]

    operations = [
        migrations.AddField(
            model_name="trainingjob",
            name="log_bytes",
            field=models.PositiveBigIntegerField(default=0),
        ),
        migrations.AddField(
            model_name="trainingjob",
            name="log_truncated_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.RunPython(count_live_logs, migrations.RunPython.noop),
    ]
