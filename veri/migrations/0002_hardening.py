import django.core.serializers.json
import django.db.models.functions.text
from django.db import migrations, models


def rename_duplicate_workspaces(apps, schema_editor):
    """Names become unique, whatever their case: a second `acme` (or `ACME`) made before this is
    renamed `acme-<its id>`."""
    Workspace = apps.get_model("veri", "Workspace")
    seen = set()
    for workspace in Workspace.objects.order_by("pk"):
        if workspace.name.lower() in seen:
            workspace.name = f"{workspace.name[:170]}-{workspace.public_id}"
            workspace.save(update_fields=["name"])
        seen.add(workspace.name.lower())


class Migration(migrations.Migration):

    dependencies = [
        ("veri", "0001_initial"),
    ]

    operations = [
        migrations.AlterField(
            model_name="idempotencyrecord",
            name="body",
            field=models.JSONField(encoder=django.core.serializers.json.DjangoJSONEncoder, null=True),
        ),
        migrations.AlterField(
            model_name="idempotencyrecord",
            name="status_code",
            field=models.PositiveSmallIntegerField(null=True),
        ),
        migrations.RunPython(rename_duplicate_workspaces, migrations.RunPython.noop),
        migrations.AddConstraint(
            model_name="workspace",
            constraint=models.UniqueConstraint(
                django.db.models.functions.text.Lower("name"), name="workspace_name_unique"
            ),
        ),
    ]
