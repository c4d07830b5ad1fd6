"""`Idempotency-Key`: the key is claimed (a row, unique per workspace) before any work is done,
so of two concurrent requests with one key only one does the work; the other waits for its answer
and replays it, or gets 409 `idempotency_in_progress` if the first is still working after
`VERI_IDEMPOTENCY_WAIT_SECONDS`. A claim whose request died without an answer is released, or
taken over once it is older than `VERI_IDEMPOTENCY_STALE_SECONDS`. Keys are kept for
`VERI_IDEMPOTENCY_KEEP_SECONDS` (a day, as Stripe keeps them), then forgotten."""

import hashlib
import json
import time
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from veri.errors import Conflict, VeriError
from veri.models import IdempotencyRecord, Workspace

MAX_KEY_CHARS = 255
POLL_SECONDS = 0.05


@dataclass(frozen=True, slots=True)
class Claim:
    record: IdempotencyRecord
    replay: bool  # True: the first request's answer is in `record`; False: this request owns it


def fingerprint(path: str, body: dict) -> str:
    payload = json.dumps([path, body], sort_keys=True, default=str)
    return hashlib.sha256(payload.encode()).hexdigest()


def _check_key(key: str) -> None:
    if not 1 <= len(key) <= MAX_KEY_CHARS or not key.isprintable() or not key.isascii():
        raise VeriError(
            f"Idempotency-Key must be 1 to {MAX_KEY_CHARS} printable ASCII characters "
            "(a UUID is a good one).",
            field="Idempotency-Key",
            code="invalid_idempotency_key",
        )


def claim(*, workspace: Workspace, key: str, fingerprint: str) -> Claim:
    _check_key(key)
    deadline = time.monotonic() + settings.VERI_IDEMPOTENCY_WAIT_SECONDS
    while True:
        try:
            with transaction.atomic():
                record = IdempotencyRecord.objects.create(
                    workspace=workspace, key=key, request_fingerprint=fingerprint
                )
            return Claim(record, replay=False)
        except IntegrityError:
            pass  # claimed before us: look at it below
        record = IdempotencyRecord.objects.filter(workspace=workspace, key=key).first()
        if record is None:
            continue  # released meanwhile: claim it again
        if record.request_fingerprint != fingerprint:
            raise Conflict(
                "This Idempotency-Key was already used for a different request.",
                code="idempotency_key_reused",
            )
        if record.status_code is not None:
            return Claim(record, replay=True)
        stale = timezone.now() - timedelta(seconds=settings.VERI_IDEMPOTENCY_STALE_SECONDS)
        if record.created_at < stale:
            IdempotencyRecord.objects.filter(
                pk=record.pk, status_code__isnull=True, created_at=record.created_at
            ).delete()
            continue
        if time.monotonic() >= deadline:
            raise Conflict(
                "A request with this Idempotency-Key is still being processed; retry in a moment "
                "to get its answer.",
                code="idempotency_in_progress",
            )
        time.sleep(POLL_SECONDS)


def record_answer(*, record: IdempotencyRecord, status_code: int, body) -> None:
    IdempotencyRecord.objects.filter(pk=record.pk).update(status_code=status_code, body=body)


def release(*, record: IdempotencyRecord) -> None:
    IdempotencyRecord.objects.filter(pk=record.pk, status_code__isnull=True).delete()


def forget_old_keys(*, now=None) -> int:
    """Delete keys older than `VERI_IDEMPOTENCY_KEEP_SECONDS`: a retry comes within minutes, and
    kept forever the table would grow with every POST."""
    now = now or timezone.now()
    cutoff = now - timedelta(seconds=settings.VERI_IDEMPOTENCY_KEEP_SECONDS)
    deleted, _ = IdempotencyRecord.objects.filter(created_at__lt=cutoff).delete()
    return deleted
