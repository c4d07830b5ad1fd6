"""The state machine, provisioning and the watchdog, with the provider faked at its boundary."""

import time
from datetime import datetime, timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from billing.models import LedgerEntry
from providers.base import CapacityError, FundsError, InstanceState, QuotaError
from providers.models import Instance, LaunchAttempt
from tests.conftest import in_threads, postgres_only
from tests.training.conftest import drive
from training import errors, tasks
from training.models import TERMINAL, JobEvent, JobStatus, TrainingJob, WatchdogState
from training.services import jobs, provisioning

pytestmark = pytest.mark.django_db
S = JobStatus


def events(job: TrainingJob) -> list[str]:
    return list(JobEvent.objects.filter(job=job).values_list("type", flat=True))


def assert_failed(job: TrainingJob, code: str) -> TrainingJob:
    job.refresh_from_db()
    assert (job.status, job.error_code) == (S.FAILED, code), (
        job.status,
        job.error_code,
        job.error_message,
    )
    assert job.error_attribution == errors.get(code).attribution
    assert job.error_message
    failed = JobEvent.objects.get(job=job, type="failed")
    assert failed.detail["code"] == code
    return job


def test_illegal_transitions_raise_and_change_nothing(submit):
    job = submit()
    with pytest.raises(jobs.InvalidTransition):
        jobs.transition_job(job_id=job.pk, to=S.RUNNING)
    job.refresh_from_db()
    assert (job.status, job.started_at, events(job)) == (S.QUEUED, None, ["queued"])
    drive(job, S.PROVISIONING, S.CONFIGURING, S.RUNNING, S.COMPLETED)
    with pytest.raises(jobs.InvalidTransition):
        jobs.transition_job(job_id=job.pk, to=S.CANCELLED)
    assert events(job) == ["queued", "provisioning", "configuring", "running", "completed"]


@hypothesis_settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(moves=st.lists(st.sampled_from(list(S)), max_size=8))
def test_random_event_sequences_keep_the_invariants(submit, moves):
    job = submit()
    reached_running = False
    for to in moves:
        before = TrainingJob.objects.get(pk=job.pk)
        try:
            jobs.transition_job(
                job_id=job.pk, to=to, error_code="training_error" if to == S.FAILED else None
            )
        except jobs.InvalidTransition:
            after = TrainingJob.objects.get(pk=job.pk)
            assert (after.status, after.finished_at) == (before.status, before.finished_at)
            continue
        reached_running |= to == S.RUNNING
        if before.status in TERMINAL:
            assert to == before.status  # terminal is final: only a repeat is accepted
    job.refresh_from_db()
    assert (job.started_at is not None) == reached_running
    terminal_events = [e for e in events(job) if e in TERMINAL]
    assert len(terminal_events) == (1 if job.status in TERMINAL else 0)
    assert (job.finished_at is not None) == (job.status in TERMINAL)


def test_provision_tries_the_next_zone_on_capacity(submit, cloud):
    cloud.outcomes = {"us-east-1a": CapacityError("no L4 here")}
    job = submit()
    assert tasks.provision_job(job_id=job.pk) == "launched"
    job.refresh_from_db()
    assert job.status == S.PROVISIONING and job.provisioning_at is not None
    assert [s.zone for s in cloud.launched] == ["us-east-1b"]
    assert list(LaunchAttempt.objects.filter(job=job).values_list("outcome", flat=True)) == [
        "capacity",
        "launched",
    ]
    instance = Instance.objects.get(job=job)
    assert instance.external_id == "i-0001" and instance.price_per_hour_micros == 805_000
    assert "VERI_JOB_TOKEN" in cloud.launched[0].env
    assert tasks.provision_job(job_id=job.pk).startswith("not claimed")  # a rerun does nothing


def test_capacity_everywhere_fails_after_max_launch_attempts(submit, cloud):
    cloud.outcomes = {
        z: CapacityError("none")
        for z in ("us-east-1a", "us-east-1b", "us-east-1c", "us-east-1d", "us-east-1f")
    }
    job = submit(max_launch_attempts=2)
    tasks.provision_job(job_id=job.pk)
    job = assert_failed(job, "CAPACITY_UNAVAILABLE")
    assert "us-east-1a, us-east-1b" in job.error_message
    assert LaunchAttempt.objects.filter(job=job).count() == 2
    assert not Instance.objects.filter(job=job).exists()


@pytest.mark.parametrize(
    "exc, code",
    [
        (QuotaError("vCPU limit"), "QUOTA_EXCEEDED"),
        (FundsError("balance 0"), "PROVIDER_OUT_OF_FUNDS"),
    ],
)
def test_quota_and_funds_fail_at_once_naming_an_alternative(submit, cloud, exc, code):
    cloud.outcomes = {"us-east-1a": exc}
    job = submit()
    tasks.provision_job(job_id=job.pk)
    job = assert_failed(job, code)
    assert job.error_attribution == "platform"
    assert "or use: provider=local gpu_type=cpu region=us-east-1" in job.error_message
    assert cloud.launched == []


@postgres_only
@pytest.mark.django_db(transaction=True)
def test_two_provision_runs_launch_one_instance(submit, cloud):
    cloud.launch_delay = 0.2
    job = submit()
    results = in_threads(2, lambda i: tasks.provision_job(job_id=job.pk))
    assert sorted(r.split(":")[0] for r in results) == ["launched", "not claimed"]
    assert len(cloud.launched) == 1 and Instance.objects.filter(job=job).count() == 1


@postgres_only
@pytest.mark.django_db(transaction=True)
def test_cancel_racing_running_ends_in_one_terminal_state(submit, cloud):
    for _ in range(5):
        job = submit()
        tasks.provision_job(job_id=job.pk)
        drive(job, S.CONFIGURING)

        def act(index, job=job):
            if index == 0:
                return jobs.cancel_job(
                    job=TrainingJob.objects.select_related("workspace").get(pk=job.pk)
                )
            jobs.transition_job(job_id=job.pk, to=S.RUNNING)
            return jobs.transition_job(job_id=job.pk, to=S.COMPLETED)

        try:
            in_threads(2, act)
        except AssertionError as exc:  # the loser finds the job already cancelled, or finished
            assert any(
                reason in str(exc) for reason in ("InvalidTransition", "cannot become", "already")
            )
        job.refresh_from_db()
        assert job.status in {S.CANCELLED, S.COMPLETED}
        assert len([e for e in events(job) if e in TERMINAL]) == 1


def test_cancel_terminates_now_and_waives_cost_before_running(submit, cloud):
    job = submit()
    tasks.provision_job(job_id=job.pk)
    job = jobs.cancel_job(job=TrainingJob.objects.select_related("workspace").get(pk=job.pk))
    assert job.status == S.CANCELLED and cloud.terminated == ["i-0001"]
    job.refresh_from_db()
    assert (
        job.cost_waived
        and job.billing.cost_micros == 0
        and job.billing.cost_attributed_at is not None
    )
    assert Instance.objects.get(job=job).terminated_at is not None


def test_a_running_job_is_charged_for_its_instance_time(submit, cloud):
    job = submit()
    tasks.provision_job(job_id=job.pk)
    Instance.objects.filter(job=job).update(launched_at=timezone.now() - timedelta(hours=2))
    drive(job, S.CONFIGURING, S.RUNNING, S.COMPLETED)
    jobs.close_out_job(job=TrainingJob.objects.select_related("workspace").get(pk=job.pk))
    job.refresh_from_db()
    assert 2 * 805_000 <= job.billing.cost_micros < 2 * 805_000 + 1000  # 2 h of one L4
    assert cloud.terminated == ["i-0001"]


def run_watchdog(now=None) -> dict:
    return tasks.check_jobs(now=now)


def test_launch_timeout_stops_a_launch_that_finishes_late(submit, cloud):
    job = submit()
    late = timezone.now() + timedelta(minutes=11)  # AWS's launch limit is 10 minutes
    # The watchdog runs while the provider is still launching; the launch then returns.
    cloud.on_launch = lambda: run_watchdog(now=late)
    assert tasks.provision_job(job_id=job.pk).startswith("launched, but the job had already ended")
    job = assert_failed(job, "launch_timeout")
    assert job.error_attribution == "platform" and job.provisioning_at is None
    assert cloud.terminated == ["i-0001"]
    assert Instance.objects.get(job=job).terminated_at is not None


def test_a_cancel_while_the_machine_is_launching_still_terminates_it(submit, cloud):
    job = submit()
    # The customer cancels while the provider is launching: the cancel finds no machine id yet.
    cloud.on_launch = lambda: jobs.cancel_job(job=TrainingJob.objects.get(pk=job.pk))
    assert tasks.provision_job(job_id=job.pk).startswith("launched, but the job had already ended")
    assert cloud.terminated == ["i-0001"]
    job.refresh_from_db()
    assert job.status == "cancelled" and Instance.objects.get(job=job).terminated_at is not None


def test_provisioning_timeout_and_error(submit, cloud, settings):
    slow, gone = submit(), submit(auto_resume=False)
    for job in (slow, gone):
        tasks.provision_job(job_id=job.pk)
    cloud.states_by_id["i-0002"] = InstanceState(alive=False)
    later = timezone.now() + timedelta(seconds=settings.VERI_PROVISIONING_TIMEOUT_SECONDS + 1)
    assert run_watchdog(now=later) == {"provisioning_timeout": 1, "provisioning_error": 1}
    assert_failed(slow, "provisioning_timeout")
    assert_failed(gone, "provisioning_error")
    jobs.close_out_job(job=TrainingJob.objects.select_related("workspace").get(pk=slow.pk))
    assert "i-0001" in cloud.terminated


def test_configuring_timeout(submit, cloud, settings):
    job = submit()
    tasks.provision_job(job_id=job.pk)
    drive(job, S.CONFIGURING)
    TrainingJob.objects.filter(pk=job.pk).update(last_heartbeat_at=timezone.now())
    later = timezone.now() + timedelta(seconds=settings.VERI_CONFIGURING_TIMEOUT_SECONDS + 1)
    TrainingJob.objects.filter(pk=job.pk).update(last_heartbeat_at=later)
    assert run_watchdog(now=later) == {"configuring_timeout": 1}
    assert_failed(job, "configuring_timeout")


def test_heartbeat_timeout_uses_the_jobs_own_deadline(submit, cloud):
    quiet, chatty = submit(heartbeat_timeout_seconds=60), submit(heartbeat_timeout_seconds=60)
    for job in (quiet, chatty):
        tasks.provision_job(job_id=job.pk)
        drive(job, S.CONFIGURING, S.RUNNING)
    now = timezone.now()
    TrainingJob.objects.filter(pk=quiet.pk).update(
        last_heartbeat_at=now - timedelta(seconds=61), last_step=12
    )
    TrainingJob.objects.filter(pk=chatty.pk).update(last_heartbeat_at=now - timedelta(seconds=30))
    assert run_watchdog(now=now) == {"heartbeat_timeout": 1}
    job = assert_failed(quiet, "heartbeat_timeout")
    assert "61 s" in job.error_message and "last step 12" in job.error_message
    assert TrainingJob.objects.get(pk=chatty.pk).status == S.RUNNING


def test_silence_while_the_watchdog_was_away_counts_from_its_return(submit, cloud, settings):
    """The platform restarted (no ticks for ten minutes): a worker silent since before is not
    failed the moment ticks resume, it gets its whole deadline from then (it may have been
    waiting for the control plane all along); a worker still silent after that is failed."""
    job = submit(heartbeat_timeout_seconds=60)
    tasks.provision_job(job_id=job.pk)
    drive(job, S.CONFIGURING, S.RUNNING)
    now = timezone.now()
    TrainingJob.objects.filter(pk=job.pk).update(last_heartbeat_at=now - timedelta(minutes=11))
    WatchdogState.objects.create(pk=1, run="old", last_tick_at=now - timedelta(minutes=10))
    settings.VERI_WATCH_PERIOD_SECONDS = 0
    assert tasks.watch_tick(run="old", due=0) == "ticked"
    assert WatchdogState.objects.get(pk=1).resumed_at is not None
    assert TrainingJob.objects.get(pk=job.pk).status == S.RUNNING
    assert run_watchdog(now=timezone.now() + timedelta(seconds=30)) == {}
    assert run_watchdog(now=timezone.now() + timedelta(seconds=61)) == {"heartbeat_timeout": 1}


def test_the_watchdogs_first_start_forgives_no_silence(db):
    """Only a return after ticks stopped moves deadlines; the first start ever (a new platform,
    or a test's) does not, or a worker killed before it would be judged late."""
    assert tasks.ensure_watch_chain() == "started"
    assert WatchdogState.objects.get(pk=1).resumed_at is None
    later = timezone.now() + timedelta(minutes=5)
    assert tasks.ensure_watch_chain(now=later) == "started"
    assert WatchdogState.objects.get(pk=1).resumed_at == later


def test_worker_failed_when_silent_900s_or_instance_gone(submit, cloud):
    silent = submit(heartbeat_timeout_seconds=3600, auto_resume=False)
    vanished = submit(auto_resume=False)
    for job in (silent, vanished):
        tasks.provision_job(job_id=job.pk)
        drive(job, S.CONFIGURING, S.RUNNING)
    now = timezone.now()
    TrainingJob.objects.filter(pk=silent.pk).update(
        last_heartbeat_at=now - timedelta(seconds=901), last_step=7
    )
    TrainingJob.objects.filter(pk=vanished.pk).update(last_heartbeat_at=now)
    cloud.states_by_id["i-0002"] = InstanceState(alive=False)
    assert run_watchdog(now=now) == {"worker_failed": 2}
    job = assert_failed(silent, "worker_failed")
    assert (
        "silent for 901 s" in job.error_message
        and "last status running, last step 7" in job.error_message
    )
    assert "instance ended" in assert_failed(vanished, "worker_failed").error_message


@pytest.mark.parametrize(
    "reason, code",
    [("reclaimed", "provider_reclaimed"), ("max_run_duration", "max_run_duration_reached")],
)
def test_provider_ended_vms(submit, cloud, reason, code):
    job = submit(auto_resume=False)
    tasks.provision_job(job_id=job.pk)
    drive(job, S.CONFIGURING, S.RUNNING)
    TrainingJob.objects.filter(pk=job.pk).update(last_heartbeat_at=timezone.now())
    cloud.states_by_id["i-0001"] = InstanceState(alive=False, reason=reason)
    run_watchdog()
    assert_failed(job, code)


def test_watchdog_query_count_does_not_grow_with_jobs(submit, cloud):
    def healthy_jobs(count):
        for _ in range(count):
            job = submit()
            tasks.provision_job(job_id=job.pk)
            drive(job, S.CONFIGURING, S.RUNNING)
            TrainingJob.objects.filter(pk=job.pk).update(last_heartbeat_at=timezone.now())

    healthy_jobs(3)
    with CaptureQueriesContext(connection) as few:
        assert run_watchdog() == {}
    healthy_jobs(9)
    calls_before = cloud.state_calls
    with CaptureQueriesContext(connection) as many:
        assert run_watchdog() == {}
    # The active jobs, when the watchdog came back, the balances, the exhausted-since marks.
    assert len(many) == len(few) <= 4
    assert cloud.state_calls - calls_before == 1  # one provider call for all twelve instances


class TaskKilled(BaseException):
    """What a SIGKILLed task worker looks like from inside the task: it never returns."""


def stalled(settings) -> datetime:
    return timezone.now() + timedelta(seconds=settings.VERI_LAUNCH_STALL_SECONDS + 1)


def test_a_launch_whose_task_died_after_the_provider_call_adopts_that_machine(
    submit, cloud, settings
):
    job = submit()
    cloud.after_launch = lambda: (_ for _ in ()).throw(TaskKilled())
    with pytest.raises(TaskKilled):
        tasks.provision_job(job_id=job.pk)
    assert Instance.objects.get(job=job).external_id == ""  # the id was never recorded
    cloud.after_launch = None

    run_watchdog(now=stalled(settings))
    job.refresh_from_db()
    assert job.status == S.PROVISIONING
    assert Instance.objects.get(job=job).external_id == "i-0001"
    assert len(cloud.launched) == 1 and cloud.terminated == []
    assert LaunchAttempt.objects.filter(job=job, outcome="launched").count() == 1
    assert "launch_recovered" in events(job)


def test_a_launch_whose_task_died_before_the_provider_call_runs_again_a_few_times(
    submit, cloud, settings
):
    job = submit()

    def killed():
        raise TaskKilled

    cloud.on_launch = killed
    for _ in range(provisioning.MAX_LAUNCH_RETRIES):
        with pytest.raises(TaskKilled):
            tasks.provision_job(job_id=job.pk)
        run_watchdog(now=stalled(settings))
        job.refresh_from_db()
        assert (job.status, job.launch_claimed_at) == (S.QUEUED, None)  # released, queued again
        assert not Instance.objects.filter(job=job).exists()
    cloud.on_launch = None
    assert tasks.provision_job(job_id=job.pk) == "launched"
    assert len(cloud.launched) == 1
    assert events(job).count("launch_retried") == provisioning.MAX_LAUNCH_RETRIES

    again = submit()
    cloud.on_launch = killed
    for _ in range(provisioning.MAX_LAUNCH_RETRIES + 1):
        with pytest.raises(TaskKilled):
            tasks.provision_job(job_id=again.pk)
        run_watchdog(now=stalled(settings))
    assert_failed(again, "launch_timeout")
    assert "interrupted 4 times" in TrainingJob.objects.get(pk=again.pk).error_message


@pytest.mark.django_db(transaction=True)
def test_a_slow_launch_renews_its_lease_and_is_not_taken_for_dead(submit, cloud, settings):
    settings.VERI_LAUNCH_STALL_SECONDS = 1
    job = submit()
    seen = []

    def slow_provider():
        time.sleep(2.5)  # longer than the stall limit; the task is alive throughout
        seen.append(run_watchdog())

    cloud.on_launch = slow_provider
    assert tasks.provision_job(job_id=job.pk) == "launched"
    assert seen == [{}]
    assert "launch_retried" not in events(job)
    assert len(cloud.launched) == 1 and cloud.terminated == []


def test_an_ended_job_whose_settle_task_was_lost_is_settled_again_and_charged_once(
    submit, cloud, settings
):
    job = submit()
    tasks.provision_job(job_id=job.pk)
    drive(job, S.CONFIGURING, S.RUNNING, S.COMPLETED)  # its settle task is never run: lost
    job.refresh_from_db()
    later = job.finished_at + timedelta(seconds=settings.VERI_SETTLE_RETRY_SECONDS + 1)
    assert tasks.requeue_unsettled(now=job.finished_at) == 0  # not yet: it may still be running
    assert tasks.requeue_unsettled(now=later) == 1
    tasks.settle_job(job_id=job.pk)
    tasks.settle_job(job_id=job.pk)  # the original task, late, and the re-queued one
    job.refresh_from_db()
    assert job.settled_at is not None
    assert LedgerEntry.objects.filter(job=job, kind="job_charge").count() == 1
    assert tasks.requeue_unsettled(now=later) == 0
