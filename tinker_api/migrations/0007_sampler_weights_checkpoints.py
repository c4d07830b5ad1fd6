from django.db import migrations, models


def sampler_saves_as_checkpoints(apps, schema_editor):
    """Named sampler saves finished before they were checkpoints kept their files in their
    operation's result, in the folder named after the operation (checkpoints.folder)."""
    TinkerOperation = apps.get_model("tinker_api", "TinkerOperation")
    TinkerCheckpoint = apps.get_model("tinker_api", "TinkerCheckpoint")
    saves = TinkerOperation.objects.filter(
        kind="save_weights_for_sampler", status="done", payload__has_key="name"
    ).select_related("model")
    for save in saves.iterator():
        files = (save.result or {}).get("files")
        if not files or TinkerCheckpoint.objects.filter(operation=save).exists():
            continue
        checkpoint = TinkerCheckpoint.objects.create(
            model=save.model,
            workspace_id=save.model.workspace_id,
            operation=save,
            name=save.payload["name"],
            kind="sampler_weights",
            files=files,
        )
        # Listed by when it was saved, not by when this migration ran.
        TinkerCheckpoint.objects.filter(pk=checkpoint.pk).update(
            created_at=save.finished_at or save.created_at
        )


class Migration(migrations.Migration):
    dependencies = [
        ("tinker_api", "0006_checkpoint_as_veri_checkpoint"),
    ]

    operations = [
        migrations.AddField(
            model_name="tinkercheckpoint",
            name="kind",
            field=models.CharField(
                choices=[("weights", "state"), ("sampler_weights", "sampler weights")],
                default="weights",
                max_length=20,
            ),
        ),
        migrations.RunPython(sampler_saves_as_checkpoints, migrations.RunPython.noop),
    ]
