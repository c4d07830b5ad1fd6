"""A job's log is bounded: served and archived a page at a time (memory stays flat however long
the log), and capped at VERI_MAX_LOG_BYTES (later lines dropped, one marker line, one
`log_truncated` event)."""

import hashlib
import time
import tracemalloc

import pytest

from tests.training.test_restarts import running
from tests.training.test_worker_and_jobs_api import w
from training import tasks
from training.models import JobEvent, TrainingJob
from training.services import jobs, logs
from volumes.stores import get_store

pytestmark = pytest.mark.django_db

# Over twice the larger limit below: serving or archiving that held the whole log would go past
# it, and each MiB more is seconds more of the suite.
LOG_MIB = 24
LINE_BYTES = 4096
# The most memory serving or archiving may take, whatever the log's size: a page of lines (about
# 1 MiB with what reads and encodes it), and on S3 one upload part too (S3's smallest, 5 MiB).
FLAT_PEAK_MIB = {"local": 4, "s3": 10}


def line_text(seq: int) -> str:
    """4,095 bytes of UTF-8 (with its newline, 4,096), some of it multi-byte."""
    head = f"{seq:08d} step {seq // 40} loss 0.{seq % 97:02d} é漢 "
    return head + "x" * (LINE_BYTES - 1 - len(head.encode()))


def write_log(job: TrainingJob, lines: int) -> tuple[str, int]:
    """Ship `lines` lines through the service the worker's endpoint calls; the digest and size
    of the log they make."""
    digest, size, batch = hashlib.sha256(), 0, 256
    for first in range(0, lines, batch):
        chunk = [{"seq": seq, "text": line_text(seq)} for seq in range(first, first + batch)]
        assert logs.append_lines(job=job, lines=chunk) == batch
        for line in chunk:
            data = f"{line['text']}\n".encode()
            digest.update(data)
            size += len(data)
    return digest.hexdigest(), size


def peak_mib(work) -> tuple[object, float]:
    """`work()`'s answer, and the most memory Python held above where it started, in MiB."""
    tracemalloc.start()
    try:
        answer = work()
        return answer, tracemalloc.get_traced_memory()[1] / 1024**2
    finally:
        tracemalloc.stop()


def served(api_client, job: TrainingJob) -> tuple[str, int]:
    """The digest and size of `GET …/logs/full`, read as a client streams it."""
    response = api_client.get(f"/v1/training_jobs/{job.public_id}/logs/full")
    assert response.status_code == 200
    assert response["Content-Type"] == "text/plain; charset=utf-8"
    digest, size = hashlib.sha256(), 0
    for chunk in response.streaming_content if response.streaming else [response.content]:
        digest.update(chunk)
        size += len(chunk)
    return digest.hexdigest(), size


def stored(job: TrainingJob) -> tuple[str, int]:
    digest, size = hashlib.sha256(), 0
    for chunk in get_store().iter_bytes(job.log_key):
        digest.update(chunk)
        size += len(chunk)
    return digest.hexdigest(), size


def test_a_log_far_larger_than_memory_is_served_and_archived_in_flat_memory(
    submit, store_kind, api_client, settings
):
    # `submit`'s dataset went to a local store; the log goes to the store this run is about.
    assert settings.VERI_STORE.startswith({"local": "file://", "s3": "s3://"}[store_kind])
    limit = FLAT_PEAK_MIB[store_kind]
    job, worker = running(submit)
    get_store()  # built once per process (boto3 reads its service models then), not per log
    expected = write_log(job, LOG_MIB * 1024**2 // LINE_BYTES)
    assert expected[1] == LOG_MIB * 1024**2
    started = time.monotonic()

    # The running job's log, from the database, as the API serves it.
    answer, peak = peak_mib(lambda: served(api_client, job))
    assert answer == expected and peak < limit, peak
    # The archiving task copies it to the store, streamed.
    answer, peak = peak_mib(tasks.archive_running_logs)
    assert answer == 1 and peak < limit, peak
    assert stored(job) == expected
    # The job ends: the final archive, then the log served from the store.
    worker.post(w(job, "complete"), {"ok": True}, format="json")
    job = TrainingJob.objects.select_related("workspace").get(pk=job.pk)
    _, peak = peak_mib(lambda: jobs.close_out_job(job=job))
    assert peak < limit, peak
    job.refresh_from_db()
    assert job.log_archived_at is not None
    answer, peak = peak_mib(lambda: served(api_client, job))
    assert answer == expected and peak < limit, peak
    assert time.monotonic() - started < 120


def test_a_log_past_its_limit_ends_with_one_marker_line_and_one_event(submit, api_client, settings):
    settings.VERI_MAX_LOG_BYTES = 1000
    job, worker = running(submit)
    ten = [{"seq": n, "text": f"{n:02d}" + "x" * 97} for n in range(10)]  # 100 bytes each
    answer = worker.post(w(job, "logs"), {"lines": ten[:6]}, format="json").json()
    assert (answer["added"], answer["log_truncated"]) == (6, False)
    more = ten[6:] + [{"seq": n, "text": f"line {n}"} for n in range(10, 15)]
    answer = worker.post(w(job, "logs"), {"lines": more}, format="json").json()
    assert (answer["added"], answer["log_truncated"]) == (4, True)  # 1,000 bytes: full
    later = [{"seq": n, "text": f"line {n}"} for n in range(15, 40)]
    answer = worker.post(w(job, "logs"), {"lines": later}, format="json").json()
    assert (answer["added"], answer["log_truncated"]) == (0, True)

    text = api_client.get(f"/v1/training_jobs/{job.public_id}/logs/full").getvalue().decode()
    *kept, marker = text.splitlines()
    assert kept == [line["text"] for line in ten]
    assert marker == logs.truncation_marker(1000)
    assert "VERI_MAX_LOG_BYTES" in marker and "dropped" in marker
    page = api_client.get(f"/v1/training_jobs/{job.public_id}/logs", {"after": 8}).json()
    assert [(line["seq"], line["text"]) for line in page["lines"]] == [
        (9, ten[9]["text"]),
        (10, marker),
    ]
    events = api_client.get(f"/v1/training_jobs/{job.public_id}/events").json()["data"]
    [truncated] = [e for e in events if e["type"] == "log_truncated"]
    assert truncated["detail"]["limit_bytes"] == 1000 and truncated["detail"]["seq"] == 10
    assert JobEvent.objects.filter(job=job, type="log_truncated").count() == 1
    # Training is not affected: the job goes on and completes.
    assert worker.post(w(job, "heartbeat"), {"step": 3}, format="json").status_code == 200
    assert worker.post(w(job, "complete"), {"ok": True}, format="json").json()["status"] == (
        "completed"
    )


def test_the_limit_counts_bytes_across_batches_and_resent_lines_once(submit, settings):
    settings.VERI_MAX_LOG_BYTES = 64
    job, worker = running(submit)
    lines = [{"seq": n, "text": "é" * 7} for n in range(4)]  # 14 bytes + newline each
    assert logs.append_lines(job=job, lines=lines) == 4  # 60 bytes
    assert logs.append_lines(job=job, lines=lines) == 0  # resent: nothing new, still 60
    job.refresh_from_db()
    assert (job.log_bytes, job.log_truncated_at) == (60, None)
    assert logs.append_lines(job=job, lines=[{"seq": 4, "text": "abc"}]) == 1  # 64: at the limit
    assert logs.append_lines(job=job, lines=[{"seq": 5, "text": ""}]) == 0  # 65: past it
    job.refresh_from_db()
    assert job.log_truncated_at is not None
