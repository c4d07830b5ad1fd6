from django.core.management.base import BaseCommand

from billing import tasks as billing_tasks
from training import tasks as training_tasks
from volumes import tasks as volume_tasks


class Command(BaseCommand):
    help = "Run every reconciler and watchdog once, then exit."

    def handle(self, *args, **options):
        runs = [
            ("reconcile_deleted_volumes", volume_tasks.reconcile_deleted_volumes),
            ("abort_stale_uploads", volume_tasks.abort_stale_uploads),
            ("take_usage_snapshots", volume_tasks.take_usage_snapshots),
            ("check_jobs", training_tasks.check_jobs),
            ("archive_running_logs", training_tasks.archive_running_logs),
            ("charge_storage", billing_tasks.charge_storage),
            ("mirror_to_stripe", billing_tasks.mirror_to_stripe),
        ]
        for name, task in runs:
            self.stdout.write(f"{name}: {task()}")
