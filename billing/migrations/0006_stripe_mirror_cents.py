from decimal import ROUND_HALF_EVEN, Decimal

from django.db import migrations, models


def cents_already_sent(apps, schema_editor):
    """Each entry mirrored before this migration sent Python's round(micros / 10_000): record
    exactly that, so the next entry's amount makes up the drift it left."""
    StripeMirror = apps.get_model("billing", "StripeMirror")
    for mirror in StripeMirror.objects.select_related("entry").iterator():
        sent = (Decimal(mirror.entry.amount_micros) / 10_000).to_integral_value(ROUND_HALF_EVEN)
        StripeMirror.objects.filter(pk=mirror.pk).update(amount_cents=int(sent))


class Migration(migrations.Migration):

    dependencies = [
        ("billing", "0005_ledger_volume_ref_only"),
    ]

    operations = [
        migrations.AddField(
            model_name="billingaccount",
            name="stripe_mirror_error",
            field=models.CharField(blank=True, max_length=300),
        ),
        migrations.AddField(
            model_name="stripemirror",
            name="amount_cents",
            field=models.BigIntegerField(default=0),
            preserve_default=False,
        ),
        migrations.AlterField(
            model_name="stripemirror",
            name="stripe_transaction_id",
            field=models.CharField(blank=True, max_length=100),
        ),
        migrations.RunPython(cents_already_sent, migrations.RunPython.noop),
    ]
