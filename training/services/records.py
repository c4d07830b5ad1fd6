from django.db import models

from training.models import TrainingJob


def insert_new(model: type[models.Model], *, job: TrainingJob, key: str, rows: list) -> list:
    """Insert the rows whose `key` (seq, step) the job does not have yet; returns those.

    A resent batch is thus a no-op, and the check reads only this batch's keys (the unique index),
    not every row of a long job. `ignore_conflicts` keeps a concurrent twin batch harmless."""
    keys = [getattr(row, key) for row in rows]
    stored = set(model.objects.filter(job=job, **{f"{key}__in": keys}).values_list(key, flat=True))
    new: dict = {}
    for row in rows:  # within one batch, too, the first row of a key wins
        if getattr(row, key) not in stored:
            new.setdefault(getattr(row, key), row)
    model.objects.bulk_create(list(new.values()), ignore_conflicts=True)
    return list(new.values())
