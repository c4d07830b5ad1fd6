"""The watchdog's rules, one at a time (training/services/watchdog.py): each rule's fault at its
deadline's far side and nothing on its near side, then `verdict`'s order between them. Jobs are
unsaved rows except where a rule reads the database; the whole watchdog, provider faked, is
tested in test_lifecycle.py and test_restarts.py."""

from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pytest
from django.conf import settings

from providers import catalog
from providers.base import InstanceState
from providers.models import Instance
from training.models import JobStatus, MetricPoint, TrainingJob
from training.services import watchdog
from training.services.watchdog import Watch

S = JobStatus
NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
ENDED = InstanceState(alive=False)


def ago(seconds: float) -> datetime:
    return NOW - timedelta(seconds=seconds)


def job(**fields) -> TrainingJob:
    defaults = {
        "provider": "local",
        "status": S.RUNNING,
        "gpu_type": "h100",
        "gpu_count": 1,
        "heartbeat_timeout_seconds": 300,
        "provisioning_at": ago(3600),
        "configuring_at": ago(3000),
        "last_heartbeat_at": ago(10),
    }
    return TrainingJob(**(defaults | fields))


def watch(the_job: TrainingJob, state: InstanceState | None = None, watched_since=None) -> Watch:
    return Watch(job=the_job, state=state, now=NOW, watched_since=watched_since)


def code(fault: watchdog.Fault | None) -> str | None:
    return fault.code if fault else None


def launch_limit() -> int:
    return catalog.get_provider("local").launch_timeout_seconds


def register_limit() -> int:
    return catalog.get_provider("local").register_timeout_seconds


RULES = [  # (rule, job fields, state, the fault's code or None)
    (watchdog.capacity_withdrawn, {"status": S.QUEUED}, ENDED, "CAPACITY_UNAVAILABLE"),
    (watchdog.capacity_withdrawn, {"status": S.QUEUED}, InstanceState(alive=True), None),
    (watchdog.capacity_withdrawn, {"status": S.QUEUED}, None, None),
    (
        watchdog.launch_timed_out,
        {"status": S.QUEUED, "launch_claimed_at": "past launch"},
        None,
        "launch_timeout",
    ),
    (
        watchdog.launch_timed_out,
        {"status": S.QUEUED, "launch_claimed_at": "within launch"},
        None,
        None,
    ),
    (watchdog.launch_timed_out, {"status": S.QUEUED, "launch_claimed_at": None}, None, None),
    (
        watchdog.reclaimed,
        {},
        InstanceState(alive=False, reason="reclaimed"),
        "provider_reclaimed",
    ),
    (watchdog.reclaimed, {}, ENDED, None),
    (
        watchdog.max_run_reported,
        {},
        InstanceState(alive=False, reason="max_run_duration"),
        "max_run_duration_reached",
    ),
    (watchdog.max_run_reported, {}, ENDED, None),
    (
        watchdog.ended_before_registering,
        {"status": S.PROVISIONING},
        ENDED,
        "provisioning_error",
    ),
    (watchdog.ended_before_registering, {"status": S.CONFIGURING}, ENDED, None),
    (watchdog.ended_before_a_result, {}, ENDED, "worker_failed"),
    (
        watchdog.register_timed_out,
        {"status": S.PROVISIONING, "provisioning_at": "past register"},
        None,
        "provisioning_error",
    ),
    (
        watchdog.register_timed_out,
        {"status": S.PROVISIONING, "provisioning_at": "within register"},
        None,
        None,
    ),
    (
        watchdog.provisioning_timed_out,
        {"status": S.PROVISIONING, "provisioning_at": "past provisioning"},
        None,
        "provisioning_timeout",
    ),
    (
        watchdog.provisioning_timed_out,
        {"status": S.PROVISIONING, "provisioning_at": "within provisioning"},
        None,
        None,
    ),
    (
        watchdog.training_never_stepped,
        {"status": S.CONFIGURING, "configuring_at": "past configuring", "worker_phase": "training"},
        None,
        "training_error",
    ),
    (
        watchdog.training_never_stepped,
        {"status": S.CONFIGURING, "configuring_at": "past configuring", "worker_phase": "setup"},
        None,
        None,
    ),
    (
        watchdog.training_never_stepped,
        {
            "status": S.CONFIGURING,
            "configuring_at": "within configuring",
            "worker_phase": "training",
        },
        None,
        None,
    ),
    (
        watchdog.configuring_timed_out,
        {"status": S.CONFIGURING, "configuring_at": "past configuring"},
        None,
        "configuring_timeout",
    ),
    (
        watchdog.configuring_timed_out,
        {"status": S.CONFIGURING, "configuring_at": "within configuring"},
        None,
        None,
    ),
    (watchdog.silent, {"last_heartbeat_at": "past heartbeat"}, None, "heartbeat_timeout"),
    (watchdog.silent, {"last_heartbeat_at": "within heartbeat"}, None, None),
    (
        watchdog.silent,
        {"heartbeat_timeout_seconds": 3600, "last_heartbeat_at": "past silent"},
        None,
        "worker_failed",
    ),
    (
        watchdog.silent,
        {"heartbeat_timeout_seconds": 3600, "last_heartbeat_at": "within silent"},
        None,
        None,
    ),
    (watchdog.stalled, {"gpu_count": 2, "last_step_at": None}, None, None),
    (watchdog.stalled, {"gpu_count": 1, "last_step_at": "past stall"}, None, None),
    (watchdog.stalled, {"gpu_count": 2, "last_step_at": "within stall"}, None, None),
    (
        watchdog.stalled,
        {"gpu_count": 2, "status": S.CONFIGURING, "last_step_at": "past stall"},
        None,
        None,
    ),
]


def deadlines() -> dict[str, float]:
    return {
        "launch": launch_limit(),
        "register": register_limit(),
        "provisioning": settings.VERI_PROVISIONING_TIMEOUT_SECONDS,
        "configuring": settings.VERI_CONFIGURING_TIMEOUT_SECONDS,
        "heartbeat": 300,
        "silent": settings.VERI_WORKER_SILENT_SECONDS,
        "stall": settings.VERI_STALL_SECONDS,
    }


def resolve(fields: dict) -> dict:
    """ "past X" / "within X": a second past deadline X, or a second short of it."""
    limits, resolved = deadlines(), {}
    for name, value in fields.items():
        if isinstance(value, str) and value.split()[0] in ("past", "within"):
            side, deadline = value.split()
            value = ago(limits[deadline] + (1 if side == "past" else -1))
        resolved[name] = value
    return resolved


@pytest.mark.parametrize(
    ("rule", "fields", "state", "expected"),
    RULES,
    ids=[f"{rule.__name__}-{expected}-{i}" for i, (rule, _, _, expected) in enumerate(RULES)],
)
def test_each_rule_faults_past_its_deadline_and_not_before(rule, fields, state, expected):
    fault = rule(watch(job(**resolve(fields)), state))
    assert code(fault) == expected
    if fault:
        assert fault.message


def test_a_machine_ending_at_the_providers_longest_run_is_max_run_duration(monkeypatch):
    monkeypatch.setattr(
        watchdog, "get_adapter", lambda provider: SimpleNamespace(max_run_seconds=7200)
    )
    ended_job = job()
    Instance(job=ended_job, external_id="i-1", launched_at=ago(7200 - 60))
    fault = watchdog.max_run_elapsed(watch(ended_job, ENDED))
    assert (fault.code, "(2 h)" in fault.message) == ("max_run_duration_reached", True)
    Instance(job=ended_job, external_id="i-1", launched_at=ago(7200 - 61))
    assert watchdog.max_run_elapsed(watch(ended_job, ENDED)) is None
    monkeypatch.setattr(
        watchdog, "get_adapter", lambda provider: SimpleNamespace(max_run_seconds=None)
    )
    assert watchdog.max_run_elapsed(watch(ended_job, ENDED)) is None


def test_silence_while_the_watchdog_was_away_counts_from_its_return():
    quiet_job = job(last_heartbeat_at=ago(3600))
    assert code(watchdog.silent(watch(quiet_job))) == "heartbeat_timeout"
    assert watchdog.silent(watch(quiet_job, watched_since=ago(60))) is None


def test_only_a_deployments_misconfiguration_and_customer_time_are_not_restarted():
    unrestartable = {
        watchdog.register_timed_out(watch(job(**resolve({"provisioning_at": "past register"})))),
        watchdog.training_never_stepped(
            watch(job(**resolve({"configuring_at": "past configuring"}), worker_phase="training"))
        ),
    }
    assert {(fault.code, fault.restart) for fault in unrestartable} == {
        ("provisioning_error", False),
        ("training_error", False),
    }
    assert watchdog.provisioning_timed_out(
        watch(job(**resolve({"provisioning_at": "past provisioning"})))
    ).restart


@pytest.mark.django_db
def test_a_multi_gpu_job_is_stalled_past_three_times_its_median_step(submit):
    stalled_job = submit()
    stall = settings.VERI_STALL_SECONDS
    step_every = stall  # three median steps make the window 3 * stall
    for step in range(5):
        MetricPoint.objects.create(
            job=stalled_job, step=step, at=ago(stall * 3 + 1 + (4 - step) * step_every), values={}
        )
    stalled_job.status, stalled_job.gpu_count, stalled_job.last_step = S.RUNNING, 2, 4
    stalled_job.last_step_at = ago(stall * 3 - 1)
    assert watchdog.stalled(watch(stalled_job)) is None  # past VERI_STALL_SECONDS, in the window
    stalled_job.last_step_at = ago(stall * 3 + 1)
    fault = watchdog.stalled(watch(stalled_job))
    assert (fault.code, fault.restart) == ("training_stalled", False)


VERDICTS = [  # (job fields, the provider's state, the verdict) : which rule wins
    ({"status": S.QUEUED, "launch_claimed_at": "past launch"}, ENDED, "CAPACITY_UNAVAILABLE"),
    ({"status": S.QUEUED, "last_heartbeat_at": "past heartbeat"}, None, None),
    (
        {"status": S.PROVISIONING, "provisioning_at": "past provisioning"},
        InstanceState(alive=False, reason="reclaimed"),
        "provider_reclaimed",
    ),
    ({"status": S.PROVISIONING, "provisioning_at": "past register"}, None, "provisioning_error"),
    (
        {"status": S.PROVISIONING, "provisioning_at": "within register", "last_heartbeat_at": None},
        None,
        None,
    ),
    (
        {"status": S.CONFIGURING, "configuring_at": "past configuring", "last_heartbeat_at": None},
        None,
        "configuring_timeout",
    ),
    (
        {
            "status": S.CONFIGURING,
            "configuring_at": "within configuring",
            "last_heartbeat_at": "past heartbeat",
        },
        None,
        "heartbeat_timeout",
    ),
    ({"status": S.RUNNING, "last_heartbeat_at": "past heartbeat"}, None, "heartbeat_timeout"),
    ({"status": S.RUNNING}, InstanceState(alive=True), None),
]


@pytest.mark.parametrize(("fields", "state", "expected"), VERDICTS)
def test_verdict_asks_the_rules_for_the_jobs_status_in_order(fields, state, expected):
    the_job = job(**resolve(fields))
    Instance(job=the_job, external_id="i-1", launched_at=ago(600))
    states = {} if state is None else {"i-1": state}
    fault = watchdog.verdict(job=the_job, states=states, now=NOW, watched_since=None)
    assert code(fault) == expected
