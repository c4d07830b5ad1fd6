from django.db import migrations

# Schedule.HOURLY is "H".
SCHEDULES = [("veri.tasks.forget_old_idempotency_keys", "H", None)]


def create_schedules(apps, schema_editor):
    Schedule = apps.get_model("django_q", "Schedule")
    for func, schedule_type, minutes in SCHEDULES:
        Schedule.objects.update_or_create(
            name=func,
            defaults={"func": func, "schedule_type": schedule_type, "minutes": minutes, "repeats": -1},
        )


def delete_schedules(apps, schema_editor):
    apps.get_model("django_q", "Schedule").objects.filter(name__in=[s[0] for s in SCHEDULES]).delete()


class Migration(migrations.Migration):
    dependencies = [
        ("veri", "0002_hardening"),
        ("django_q", "0018_task_success_index"),
    ]

    operations = [migrations.RunPython(create_schedules, delete_schedules)]
