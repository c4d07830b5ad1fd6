from django.core.management.base import BaseCommand, CommandError

from providers.services import get_adapter
from training.models import JobStatus, TrainingJob


class Command(BaseCommand):
    help = (
        "Warn a running job's local machine that it is taken away in SECONDS, as a spot market "
        "would: the worker saves a checkpoint at once, the machine ends at that time, and the "
        "job restarts from the checkpoint (local provider only)."
    )

    def add_arguments(self, parser):
        parser.add_argument("job_id")
        parser.add_argument("--seconds", type=float, default=30.0)

    def handle(self, *args, job_id: str, seconds: float, **options):
        job = TrainingJob.objects.filter(public_id=job_id).first()
        if job is None:
            raise CommandError(f"No job {job_id}.")
        if job.provider != "local":
            raise CommandError(f"{job_id} runs on {job.provider}; only local machines simulate.")
        if job.status not in (JobStatus.CONFIGURING, JobStatus.RUNNING):
            raise CommandError(f"{job_id} is {job.status}, not on a machine.")
        get_adapter("local").simulate_preemption(job.public_id, seconds=seconds)
        self.stdout.write(f"{job_id}: its machine is taken away in {seconds:g} s")
