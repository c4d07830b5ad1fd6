"""The job's stdout: lines in the database while it runs, one text file in the store for good.

A log can be far larger than a process should hold (a training loop printing every token), so
nothing here joins a whole log: it moves between the database, the store and the response a page
of lines at a time, and a job keeps at most VERI_MAX_LOG_BYTES of it."""

from collections.abc import Iterator

from django.conf import settings
from django.db import transaction
from django.db.models import Func, IntegerField, Max
from django.utils import timezone

from training.models import JobEvent, LogChunk, TrainingJob
from volumes.stores import StoreError, store_for

# A page read from the database: at most this many lines, and lines of at most this many bytes
# in all (a line holds up to 16,384 characters, 64 KiB of UTF-8 at worst).
PAGE_LINES = 2000
PAGE_BYTES = 256 * 1024


class OctetLength(Func):
    """A text's size in bytes. PostgreSQL reads it from a long (compressed) value's header, where
    `LENGTH` in characters decompresses every line of the page just to count."""

    function = "OCTET_LENGTH"
    output_field = IntegerField()

    def as_sqlite(self, compiler, connection, **extra_context):
        # OCTET_LENGTH came in SQLite 3.43; a text cast to a blob is its UTF-8 bytes.
        return self.as_sql(compiler, connection, template="LENGTH(CAST(%(expressions)s AS BLOB))")


def _size(text: str) -> int:
    """What a line takes in the log: its UTF-8 bytes and the newline."""
    return len(text.encode()) + 1


def truncation_marker(limit: int) -> str:
    return (
        f"[veri] This job's log reached its limit of {limit / 1024**2:g} MiB "
        "(VERI_MAX_LOG_BYTES): later lines are dropped. Training goes on; metrics, checkpoints "
        "and the result are kept as usual."
    )


def append_lines(*, job: TrainingJob, lines: list[dict]) -> int:
    """Store `[{seq, text, at?}]`; lines already stored (a resent batch) are ignored, and gaps
    are kept as they are (a later batch may fill them). A line that would take the job's log
    past VERI_MAX_LOG_BYTES is replaced by one marker line, a `log_truncated` event is recorded
    (once), and every later line is dropped. Returns how many lines were kept."""
    now, limit = timezone.now(), settings.VERI_MAX_LOG_BYTES
    with transaction.atomic():
        # The job's row lock keeps its byte count exact under concurrent batches.
        locked = (
            TrainingJob.objects.select_for_update()
            .only("log_bytes", "log_truncated_at")
            .get(pk=job.pk)
        )
        if locked.log_truncated_at:
            return 0
        stored = set(
            LogChunk.objects.filter(job=job, seq__in=[line["seq"] for line in lines]).values_list(
                "seq", flat=True
            )
        )
        new: dict[int, dict] = {}
        for line in lines:  # within one batch, too, the first line of a seq wins
            if line["seq"] not in stored:
                new.setdefault(line["seq"], line)
        size, rows, cut_at = locked.log_bytes, [], None
        for seq in sorted(new):
            line = new[seq]
            if size + _size(line["text"]) > limit:
                cut_at = seq
                break
            size += _size(line["text"])
            rows.append(LogChunk(job=job, seq=seq, text=line["text"], at=line.get("at") or now))
        if cut_at is not None:
            marker = truncation_marker(limit)
            rows.append(LogChunk(job=job, seq=cut_at, text=marker, at=now))
            size += _size(marker)
        LogChunk.objects.bulk_create(rows, ignore_conflicts=True)
        TrainingJob.objects.filter(pk=job.pk).update(
            log_bytes=size, log_truncated_at=now if cut_at is not None else None
        )
        if cut_at is not None:
            JobEvent.objects.create(
                job=job,
                type="log_truncated",
                detail={"limit_bytes": limit, "seq": cut_at, "message": truncation_marker(limit)},
            )
    return len(rows) - (cut_at is not None)


def is_truncated(*, job: TrainingJob) -> bool:
    return TrainingJob.objects.filter(pk=job.pk, log_truncated_at__isnull=False).exists()


def next_seq(*, job: TrainingJob) -> int:
    newest = LogChunk.objects.filter(job=job).aggregate(seq=Max("seq"))["seq"]
    return 0 if newest is None else newest + 1


def stream_lines(*, job: TrainingJob, through: int | None = None) -> Iterator[bytes]:
    """The job's lines in order (up to seq `through`), each with its newline, as UTF-8 chunks
    of at most a page: lines' sizes are read first, then only as many lines as fit in
    PAGE_BYTES, so memory stays flat however long the log and whatever its lines' lengths."""
    after = -1
    while True:
        lines = LogChunk.objects.filter(job=job, seq__gt=after)
        if through is not None:
            lines = lines.filter(seq__lte=through)
        sizes = list(
            lines.order_by("seq")
            .annotate(size=OctetLength("text"))
            .values_list("seq", "size")[:PAGE_LINES]
        )
        if not sizes:
            return
        last, taken = sizes[0][0], 0
        for seq, size in sizes:
            if taken and taken + size > PAGE_BYTES:
                break
            last, taken = seq, taken + size
        texts = lines.filter(seq__lte=last).order_by("seq").values_list("text", flat=True)
        yield "".join(f"{text}\n" for text in texts).encode()
        after = last


def full_log(*, job: TrainingJob) -> Iterator[bytes] | None:
    """The whole log as chunks: once the job has ended and its log was archived for good, the
    store's copy; else the lines in the database (a running job's, or an ended one's whose
    final archive has not been written yet). None when an ended job has neither."""
    has_lines = LogChunk.objects.filter(job=job).exists()
    if job.is_terminal and (job.log_archived_at or not has_lines):
        try:
            return store_for(job.output_prefix).iter_bytes(job.log_key)
        except StoreError:
            pass
    if job.is_terminal and not has_lines:
        return None
    return stream_lines(job=job)


def archive_log(*, job: TrainingJob, final: bool = False) -> bool:
    """Write the whole log so far to the store (running jobs: every few seconds; finished jobs:
    once more, final), streamed from the database to the store a page at a time. Skips the
    write when no line arrived since the last one."""
    newest = LogChunk.objects.filter(job=job).aggregate(seq=Max("seq"))["seq"]
    if newest is None or (job.log_archived_seq == newest and (not final or job.log_archived_at)):
        return False
    store_for(job.output_prefix).put_stream(job.log_key, stream_lines(job=job, through=newest))
    with transaction.atomic():
        TrainingJob.objects.filter(pk=job.pk).update(
            log_archived_seq=newest, log_archived_at=timezone.now() if final else None
        )
    job.log_archived_seq = newest
    return True
