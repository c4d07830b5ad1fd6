"""Billing's per-job record of money: the cost stamps move here from training's job row, so
billing writes none of training's rows (training's 0015 then drops its copies)."""

import django.db.models.deletion
from django.db import migrations, models
from django.db.models import Q

STAMPS = ("cost_micros", "cost_attributed_at", "billing_deducted_at")


def copy_from_jobs(apps, schema_editor):
    TrainingJob = apps.get_model("training", "TrainingJob")
    JobBilling = apps.get_model("billing", "JobBilling")
    stamped = TrainingJob.objects.filter(
        Q(cost_micros__isnull=False)
        | Q(cost_attributed_at__isnull=False)
        | Q(billing_deducted_at__isnull=False)
    )
    rows = stamped.values_list("pk", *STAMPS).iterator(chunk_size=2000)
    batch = []
    for pk, cost, attributed, deducted in rows:
        batch.append(
            JobBilling(
                job_id=pk,
                cost_micros=cost,
                cost_attributed_at=attributed,
                billing_deducted_at=deducted,
            )
        )
        if len(batch) == 2000:
            JobBilling.objects.bulk_create(batch, ignore_conflicts=True)
            batch = []
    JobBilling.objects.bulk_create(batch, ignore_conflicts=True)


def copy_to_jobs(apps, schema_editor):
    TrainingJob = apps.get_model("training", "TrainingJob")
    JobBilling = apps.get_model("billing", "JobBilling")
    for row in JobBilling.objects.values_list("job_id", *STAMPS).iterator(chunk_size=2000):
        job_id, cost, attributed, deducted = row
        TrainingJob.objects.filter(pk=job_id).update(
            cost_micros=cost, cost_attributed_at=attributed, billing_deducted_at=deducted
        )


class Migration(migrations.Migration):
    dependencies = [
        ("billing", "0007_stripe_events_and_modes"),
        ("training", "0014_worker_phase"),
    ]

    operations = [
        migrations.CreateModel(
            name="JobBilling",
            fields=[
                (
                    "job",
                    models.OneToOneField(
                        on_delete=django.db.models.deletion.CASCADE,
                        primary_key=True,
                        related_name="billing",
                        serialize=False,
                        to="training.trainingjob",
                    ),
                ),
                ("cost_micros", models.PositiveBigIntegerField(blank=True, null=True)),
                ("cost_attributed_at", models.DateTimeField(blank=True, null=True)),
                ("billing_deducted_at", models.DateTimeField(blank=True, null=True)),
            ],
        ),
        migrations.RunPython(copy_from_jobs, copy_to_jobs),
    ]
