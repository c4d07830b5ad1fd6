from django.db import migrations

# Schedule.MINUTES is "I": due retries are picked up within a minute.
SCHEDULES = [("webhooks.tasks.deliver_due", "I", 1)]


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
        ("webhooks", "0001_initial"),
        ("django_q", "0018_task_success_index"),
    ]

    operations = [migrations.RunPython(create_schedules, delete_schedules)]
