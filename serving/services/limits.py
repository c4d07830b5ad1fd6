"""Per-workspace rate limits on the inference routes, requests and tokens per minute, as OpenAI
keeps them: token buckets that refill continuously (GCRA), the answer's `x-ratelimit-*`
headers saying what is left, and 429 with `retry-after` past them.

One conditional upsert decides, in PostgreSQL (no Redis needed on the embedded default; the
cache would be per process): the row is locked by the statement, so two requests can never
both take the last place. A request is counted against tokens per minute before it runs, by
an estimate (its prompt at about four characters a token, plus the most it may generate), as
OpenAI does."""

import json
import math
import time
from dataclasses import dataclass

from django.conf import settings
from django.db import connection

from serving.models import RateLimit
from veri.errors import TooManyRequests
from veri.models import Workspace

PERIOD = 60.0  # seconds: limits are per minute
# The serving process's `max_tokens` when a request gives none (worker.openai_requests).
DEFAULT_MAX_TOKENS = {"chat": 256, "completion": 16}

# PostgreSQL's GREATEST/LEAST are SQLite's many-argument MAX/MIN (the embedded default).
ADMIT = """
INSERT INTO serving_ratelimit AS r (workspace_id, requests_full_at, tokens_full_at)
VALUES (%(ws)s, %(now)s + %(period)s / %(rpm)s, %(now)s + %(period)s * %(cost)s / %(tpm)s)
ON CONFLICT (workspace_id) DO UPDATE SET
    requests_full_at = GREATEST(r.requests_full_at, %(now)s)
        + %(period)s / COALESCE(r.requests_per_minute, %(rpm)s),
    tokens_full_at = GREATEST(r.tokens_full_at, %(now)s)
        + %(period)s * LEAST(%(cost)s, COALESCE(r.tokens_per_minute, %(tpm)s))
        / COALESCE(r.tokens_per_minute, %(tpm)s)
WHERE GREATEST(r.requests_full_at, %(now)s)
        + %(period)s / COALESCE(r.requests_per_minute, %(rpm)s) <= %(now)s + %(period)s
    AND GREATEST(r.tokens_full_at, %(now)s)
        + %(period)s * LEAST(%(cost)s, COALESCE(r.tokens_per_minute, %(tpm)s))
        / COALESCE(r.tokens_per_minute, %(tpm)s) <= %(now)s + %(period)s
RETURNING requests_full_at, tokens_full_at,
    COALESCE(requests_per_minute, %(rpm)s), COALESCE(tokens_per_minute, %(tpm)s)
"""


@dataclass(frozen=True, slots=True)
class Bucket:
    limit: int
    full_at: float  # epoch seconds when it is full again

    def remaining(self, now: float) -> int:
        left = math.floor((now + PERIOD - self.full_at) * self.limit / PERIOD + 1e-9)
        return min(self.limit, max(0, left))

    def reset(self, now: float) -> float:
        return max(0.0, self.full_at - now)


def estimate_tokens(body: dict) -> int:
    chat = "messages" in body
    prompt = json.dumps(body.get("messages") if chat else body.get("prompt", ""))
    limit = body.get("max_completion_tokens") or body.get("max_tokens")
    if not isinstance(limit, int) or limit < 1:
        limit = DEFAULT_MAX_TOKENS["chat" if chat else "completion"]
    n = body.get("n")
    return len(prompt) // 4 + limit * (n if isinstance(n, int) and n > 0 else 1)


def duration(seconds: float) -> str:
    """As OpenAI writes its resets: `20ms`, `1.5s`, `6m0s`."""
    if seconds < 1:
        return f"{math.ceil(seconds * 1000)}ms"
    minutes, rest = divmod(seconds, 60)
    rest = f"{round(rest, 3):g}s"
    return f"{int(minutes)}m{rest}" if minutes else rest


def headers(requests: Bucket, tokens: Bucket, now: float) -> dict[str, str]:
    return {
        "x-ratelimit-limit-requests": str(requests.limit),
        "x-ratelimit-remaining-requests": str(requests.remaining(now)),
        "x-ratelimit-reset-requests": duration(requests.reset(now)),
        "x-ratelimit-limit-tokens": str(tokens.limit),
        "x-ratelimit-remaining-tokens": str(tokens.remaining(now)),
        "x-ratelimit-reset-tokens": duration(tokens.reset(now)),
    }


def admit(*, workspace: Workspace, tokens: int) -> dict[str, str]:
    """Take one request and `tokens` from the workspace's buckets; the headers to answer with.
    Past a limit: TooManyRequests (429), nothing taken, its headers saying when to retry."""
    now = time.time()
    params = {
        "ws": workspace.pk,
        "now": now,
        "period": PERIOD,
        "rpm": settings.VERI_RATE_LIMIT_REQUESTS_PER_MINUTE,
        "tpm": settings.VERI_RATE_LIMIT_TOKENS_PER_MINUTE,
        # A request larger than a whole minute's tokens waits for a full bucket, no more.
        "cost": min(tokens, settings.VERI_RATE_LIMIT_TOKENS_PER_MINUTE),
    }
    sql = ADMIT
    if connection.vendor == "sqlite":
        sql = sql.replace("GREATEST(", "MAX(").replace("LEAST(", "MIN(")
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        row = cursor.fetchone()
    if row is not None:
        return headers(Bucket(row[2], row[0]), Bucket(row[3], row[1]), now)
    limit = RateLimit.objects.get(workspace=workspace)
    requests = Bucket(limit.requests_per_minute or params["rpm"], limit.requests_full_at)
    tokens_bucket = Bucket(limit.tokens_per_minute or params["tpm"], limit.tokens_full_at)
    # Past which limit, and when one more request (of this size) fits again.
    wait_requests = requests.full_at + PERIOD / requests.limit - (now + PERIOD)
    cost = min(tokens, tokens_bucket.limit)
    wait_tokens = tokens_bucket.full_at + PERIOD * cost / tokens_bucket.limit - (now + PERIOD)
    kind, wait = (
        ("requests", wait_requests) if wait_requests >= wait_tokens else ("tokens", wait_tokens)
    )
    limit_value = requests.limit if kind == "requests" else tokens_bucket.limit
    per = "requests per min (RPM)" if kind == "requests" else "tokens per min (TPM)"
    wait = max(wait, 0.001)
    raise TooManyRequests(
        f"Rate limit reached for {per} in workspace {workspace.name}: limit {limit_value}. "
        f"Please try again in {duration(wait)}.",
        type=kind,
        headers=headers(requests, tokens_bucket, now)
        | {"retry-after": str(math.ceil(wait)), "retry-after-ms": str(math.ceil(wait * 1000))},
    )
