"""The job's stdout: lines in the database while it runs, one text file in the store for good."""

from django.db import transaction
from django.db.models import Max
from django.utils import timezone

from training.models import LogChunk, TrainingJob
from training.services.records import insert_new
from volumes.stores import StoreError, store_for


def append_lines(*, job: TrainingJob, lines: list[dict]) -> int:
    """Store `[{seq, text, at?}]`; lines already stored (a resent batch) are ignored, and gaps
    are kept as they are (a later batch may fill them). Returns how many were new."""
    now = timezone.now()
    rows = [
        LogChunk(job=job, seq=line["seq"], text=line["text"], at=line.get("at") or now)
        for line in lines
    ]
    return len(insert_new(LogChunk, job=job, key="seq", rows=rows))


def next_seq(*, job: TrainingJob) -> int:
    newest = LogChunk.objects.filter(job=job).aggregate(seq=Max("seq"))["seq"]
    return 0 if newest is None else newest + 1


def full_text(*, job: TrainingJob) -> str:
    texts = LogChunk.objects.filter(job=job).order_by("seq").values_list("text", flat=True)
    return "".join(f"{text}\n" for text in texts.iterator())


def archive_log(*, job: TrainingJob, final: bool = False) -> bool:
    """Write the whole log so far to the store (running jobs: every few seconds; finished jobs:
    once more, final). Skips the write when no line arrived since the last one."""
    newest = LogChunk.objects.filter(job=job).aggregate(seq=Max("seq"))["seq"]
    if newest is None or (job.log_archived_seq == newest and (not final or job.log_archived_at)):
        return False
    store_for(job.output_prefix).put_bytes(job.log_key, full_text(job=job).encode())
    with transaction.atomic():
        TrainingJob.objects.filter(pk=job.pk).update(
            log_archived_seq=newest, log_archived_at=timezone.now() if final else None
        )
    job.log_archived_seq = newest
    return True


def archived_text(*, job: TrainingJob) -> str | None:
    try:
        return store_for(job.output_prefix).get_bytes(job.log_key).decode()
    except StoreError:
        return None
