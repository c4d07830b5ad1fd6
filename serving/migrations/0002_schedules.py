from django.db import migrations

# (task, schedule type, minutes): Schedule.MINUTES is "I".
SCHEDULES = [("serving.tasks.watch_deployments", "I", 1)]


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
        ("serving", "0001_initial"),
        ("django_q", "0018_task_success_index"),
    ]

    operations = [migrations.RunPython(create_schedules, delete_schedules)]
