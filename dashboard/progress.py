"""How far along a job is and what it has cost so far, as its page and the jobs list show them:
step of total, elapsed time, an ETA from the recent step rate, and the cost while it runs.

`seconds_per_step` and `eta_seconds` are pure: they take the recent metric points as (step, time)
pairs, so the estimate is tested without a job."""

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from statistics import median

from django.utils import timezone

from billing import selectors as billing_selectors
from dashboard.templatetags.dashboard import dollars
from training import selectors
from training.models import JobStatus, TrainingJob

WINDOW = 30  # the newest metric points the step rate is read from
OUTLIER = 4  # an interval this many times slower or faster than the median is a restart or jump


def seconds_per_step(points: Sequence[tuple[int, datetime]]) -> float | None:
    """Seconds a step takes, from `points` (step, when it arrived) of the recent window.

    The worker ships points about every second, so several can share an arrival time: they are
    one interval. A restart shows as one long pause, a resume as steps that jump ahead in no
    time, a replayed step as one going back: intervals far from the median (or going back) are
    left out, and the rest give the rate (their seconds over their steps)."""
    arrivals: list[tuple[int, datetime]] = []
    for step, at in sorted(points, key=lambda p: (p[1], p[0])):
        if arrivals and arrivals[-1][1] == at:
            arrivals[-1] = (max(step, arrivals[-1][0]), at)
        else:
            arrivals.append((step, at))
    intervals = [
        (s1 - s0, (t1 - t0).total_seconds())
        for (s0, t0), (s1, t1) in zip(arrivals, arrivals[1:], strict=False)
        if s1 > s0
    ]
    if not intervals:
        return None
    typical = median(seconds / steps for steps, seconds in intervals)
    kept = [
        (steps, seconds)
        for steps, seconds in intervals
        if typical / OUTLIER <= seconds / steps <= typical * OUTLIER
    ]
    return sum(s for _, s in kept) / sum(n for n, _ in kept)


def eta_seconds(
    *, points: Sequence[tuple[int, datetime]], total: int | None, now: datetime
) -> float | None:
    """Seconds until step `total`, at the recent rate, counted from the newest point (the time
    since it is already spent); None without a total or a rate."""
    rate = seconds_per_step(points)
    if total is None or rate is None:
        return None
    last_step, last_at = max(points, key=lambda p: (p[0], p[1]))
    remaining = max(total - last_step, 0) * rate - (now - last_at).total_seconds()
    return max(remaining, 0.0)


def total_steps(job: TrainingJob) -> tuple[int | None, bool]:
    """(the job's last step, estimated): its `max_steps`; else from its `epochs` and the `epoch`
    the trainer reports with each step (the worker computes the steps from the rows, the
    control plane never sees them); (None, False) when neither is known yet."""
    hp = job.hyperparameters or {}
    if isinstance(hp.get("max_steps"), int):
        return hp["max_steps"], False
    epoch = ((job.metrics_summary or {}).get("last") or {}).get("epoch")
    epochs = hp.get("epochs")
    if job.last_step and isinstance(epoch, int | float) and epoch > 0 and epochs:
        return math.ceil(job.last_step * epochs / epoch - 1e-6), True
    return None, False


def duration(seconds: float | None) -> str:
    """`45s`, `3m 05s`, `2h 04m`: as the worker's progress lines write it."""
    if seconds is None:
        return "—"
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m {seconds % 60:02d}s"
    return f"{seconds // 3600}h {seconds % 3600 // 60:02d}m"


@dataclass(frozen=True)
class Progress:
    step: int | None
    total: int | None
    total_estimated: bool
    percent: int | None  # whole percent of the total, None without one
    elapsed_seconds: float | None
    eta_seconds: float | None
    cost_micros: int | None  # charged once billed, else accrued so far (None before launch)
    cost_final: bool

    running: bool

    @property
    def step_text(self) -> str:
        if self.step is None:
            return "not started"
        if self.total is None:
            return f"step {self.step} (total unknown)"
        return f"step {self.step} / {'≈' if self.total_estimated else ''}{self.total}"

    @property
    def elapsed_text(self) -> str:
        return duration(self.elapsed_seconds)

    @property
    def eta_text(self) -> str:
        if not self.running:
            return "—"
        if self.total is None:
            return "unknown (no max_steps)"
        return duration(self.eta_seconds) if self.eta_seconds is not None else "estimating…"

    @property
    def cost_text(self) -> str:
        if self.cost_micros is None:
            return "—"
        return f"{dollars(self.cost_micros)} USD{'' if self.cost_final else ' so far'}"

    def as_json(self) -> dict:
        return {
            "step": self.step,
            "total": self.total,
            "percent": self.percent,
            "running": self.running,
            "elapsed_seconds": self.elapsed_seconds,
            "eta_seconds": self.eta_seconds,
            "cost": None if self.cost_micros is None else dollars(self.cost_micros),
            "cost_final": self.cost_final,
            "step_text": self.step_text,
            "elapsed_text": self.elapsed_text,
            "eta_text": self.eta_text,
            "cost_text": self.cost_text,
        }


def job_progress(
    job: TrainingJob, *, now: datetime | None = None, recent: list[tuple] | None = None
) -> Progress:
    """A job's progress now. While it runs its newest points give the ETA: `recent` (from
    `jobs_progress`) or read here. Select `instance` with the job to save a query."""
    now = now or timezone.now()
    total, estimated = total_steps(job)
    step = job.last_step
    percent = None
    if total and step is not None:
        percent = 100 if job.status == JobStatus.COMPLETED else min(100, step * 100 // total)
    elapsed = None
    if job.started_at:
        # Since its first run started: a restart (auto-resume) starts `started_at` over.
        first = min(
            (a.launched_at for a in job.attempts.all() if a.launched_at), default=job.started_at
        )
        elapsed = ((job.finished_at or now) - min(first, job.started_at)).total_seconds()
    eta = None
    if job.status == JobStatus.RUNNING and total:
        if recent is None:
            recent = selectors.recent_metric_steps(jobs=[job], limit=WINDOW)[job.pk]
        eta = eta_seconds(points=recent, total=total, now=now)
    cost = billing_selectors.job_cost_micros(job=job)
    final = cost is not None
    if not final and getattr(job, "instance", None) is not None:
        cost = billing_selectors.job_accrued_micros(job=job, at=None)
    running = job.status == JobStatus.RUNNING
    return Progress(step, total, estimated, percent, elapsed, eta, cost, final, running)


def jobs_progress(jobs: list[TrainingJob]) -> list[Progress]:
    """The progress of a page of jobs (read with `instance`), in one query for their ETAs."""
    now = timezone.now()
    running = [job for job in jobs if job.status == JobStatus.RUNNING]
    recent = selectors.recent_metric_steps(jobs=running, limit=WINDOW) if running else {}
    return [job_progress(job, now=now, recent=recent.get(job.pk)) for job in jobs]
