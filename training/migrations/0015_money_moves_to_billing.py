"""The cost stamps leave the job row: billing's 0008 copied them onto `billing.JobBilling` first
(hence the dependency, the one place training names billing: reversing this migration restores
the columns before billing's copies them back)."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("training", "0014_worker_phase"),
        ("billing", "0008_job_billing"),
    ]

    operations = [
        migrations.RemoveField(model_name="trainingjob", name="billing_deducted_at"),
        migrations.RemoveField(model_name="trainingjob", name="cost_attributed_at"),
        migrations.RemoveField(model_name="trainingjob", name="cost_micros"),
    ]
