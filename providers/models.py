from datetime import datetime

from django.db import models
from django.utils import timezone

from veri.money import compute_micros


class Instance(models.Model):
    """A machine leased for one job. Cost accrues from `launched_at` to `terminated_at`."""

    job = models.OneToOneField(
        "training.TrainingJob", on_delete=models.CASCADE, related_name="instance"
    )
    provider = models.CharField(max_length=30, db_index=True)
    external_id = models.CharField(max_length=200, blank=True)  # empty while launching
    region = models.CharField(max_length=40)
    zone = models.CharField(max_length=60)
    gpu_type = models.CharField(max_length=60)
    gpu_count = models.PositiveSmallIntegerField()
    price_per_hour_micros = models.PositiveBigIntegerField()
    launched_at = models.DateTimeField(null=True)
    terminated_at = models.DateTimeField(null=True, db_index=True)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"{self.provider}:{self.external_id or 'launching'}"

    def accrued_micros(self, *, at: datetime | None = None) -> int:
        """What this machine has cost: per second from its launch to `at` (by default its
        termination, or now while it runs), at its hourly price; nothing before it launched.
        The one place a machine's cost is computed."""
        if not self.launched_at:
            return 0
        end = at or self.terminated_at or timezone.now()
        return compute_micros(
            price_per_hour_micros=self.price_per_hour_micros, start=self.launched_at, end=end
        )


class LaunchAttempt(models.Model):
    job = models.ForeignKey(
        "training.TrainingJob", on_delete=models.CASCADE, related_name="launch_attempts"
    )
    provider = models.CharField(max_length=30)
    zone = models.CharField(max_length=60)
    outcome = models.CharField(
        max_length=30
    )  # launched | requested | capacity | quota | funds | no_slot | error
    message = models.TextField(blank=True)
    at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"{self.provider}/{self.zone}: {self.outcome}"


class ProviderLock(models.Model):
    """One row per provider, locked while a launch takes a slot (local provider)."""

    name = models.CharField(max_length=30, unique=True)

    def __str__(self) -> str:
        return self.name
