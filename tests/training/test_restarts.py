"""Auto-resume: a platform fault after launch restarts the job from its newest checkpoint (same
job id, a new run), customer faults never do, and money follows the runs: charged for compute
kept, credited for compute lost after each restarted run's last checkpoint."""

from datetime import timedelta

import pytest
from django.utils import timezone

from billing.jobs import split_run
from billing.models import LedgerEntry, Refund
from providers import catalog
from providers.base import CapacityError, InstanceState, ProviderError
from providers.models import Instance
from providers.services import get_adapter
from tests.conftest import fill_volume, get_url
from tests.training.conftest import drive, worker_client
from tests.training.test_worker_and_jobs_api import upload_checkpoint, w
from training import tasks
from training.models import Checkpoint, JobAttempt, JobEvent, JobStatus, TrainingJob
from volumes.models import VolumeFile
from volumes.stores import get_store
from volumes.tasks import reconcile_deleted_volumes
from worker.runner import registration

pytestmark = pytest.mark.django_db
S = JobStatus
L4_PER_HOUR = 805_000  # the fake cloud's one L4, in micro-dollars


def running(submit, **fields) -> tuple[TrainingJob, object]:
    job = submit(**fields)
    tasks.provision_job(job_id=job.pk)
    worker = worker_client(TrainingJob.objects.get(pk=job.pk))
    worker.post(w(job, "register"), registration(), format="json")
    worker.post(w(job, "status"), {"status": "running"}, format="json")
    job.refresh_from_db()
    return job, worker


def machine_lost(cloud, job: TrainingJob) -> dict:
    """The provider reports the job's machine gone: what the watchdog finds."""
    cloud.states_by_id[Instance.objects.get(job=job).external_id] = InstanceState(alive=False)
    return tasks.check_jobs()


def test_a_lost_machine_restarts_the_job_from_its_newest_checkpoint(submit, cloud):
    job, worker = running(submit)
    for step in (10, 20):
        upload_checkpoint(worker, job, step)
    lines = [{"seq": n, "text": f"line {n}"} for n in range(5)]
    worker.post(w(job, "logs"), {"lines": lines}, format="json")
    assert machine_lost(cloud, job) == {"worker_failed": 1}

    job.refresh_from_db()
    assert (job.status, job.attempt, job.resume_from.step) == (S.QUEUED, 2, 20)
    restarted = JobEvent.objects.get(job=job, type="job_restarted").detail
    assert (restarted["cause"], restarted["attempt"], restarted["from_step"]) == (
        "worker_failed",
        2,
        20,
    )
    assert cloud.terminated == ["i-0001"]
    [run] = JobAttempt.objects.filter(job=job)
    assert (run.number, run.cause, run.instance_id, run.checkpoint_step) == (
        1,
        "worker_failed",
        "i-0001",
        20,
    )
    # The ended run's worker is cut off; the next run gets its own machine and token.
    assert worker.post(w(job, "heartbeat"), {"step": 21}, format="json").status_code == 401
    assert tasks.provision_job(job_id=job.pk) == "launched"
    new_worker = worker_client(TrainingJob.objects.get(pk=job.pk))
    spec = new_worker.get(w(job, "spec")).json()
    assert (spec["resume_from"]["step"], spec["attempt"], spec["log_seq_start"]) == (20, 2, 5)
    assert Instance.objects.get(job=job).external_id == "i-0002"


def test_a_job_without_a_checkpoint_restarts_from_step_0(submit, cloud):
    job, _ = running(submit)
    machine_lost(cloud, job)
    job.refresh_from_db()
    assert (job.status, job.resume_from) == (S.QUEUED, None)
    assert JobEvent.objects.get(job=job, type="job_restarted").detail["from_step"] == 0


@pytest.mark.parametrize("code", ["training_error", "oom", "invalid_dataset"])
def test_customer_faults_never_restart(submit, cloud, code):
    job, worker = running(submit)
    upload_checkpoint(worker, job, 10)
    worker.post(w(job, "complete"), {"ok": False, "error_code": code}, format="json")
    job.refresh_from_db()
    assert (job.status, job.error_code, job.attempt) == (S.FAILED, code, 1)
    assert not JobEvent.objects.filter(job=job, type="job_restarted").exists()


def test_a_worker_reported_hardware_error_restarts_and_auto_resume_off_does_not(submit, cloud):
    job, worker = running(submit)
    # Found by the runner's check after the training ended (the only phase it is believed from
    # once the training ran).
    worker.post(w(job, "phase"), {"phase": "finishing"}, format="json")
    worker.post(w(job, "complete"), {"ok": False, "error_code": "hardware_error"}, format="json")
    assert TrainingJob.objects.get(pk=job.pk).status == S.QUEUED
    off, worker = running(submit, auto_resume=False)
    worker.post(w(off, "phase"), {"phase": "finishing"}, format="json")
    worker.post(w(off, "complete"), {"ok": False, "error_code": "hardware_error"}, format="json")
    assert TrainingJob.objects.get(pk=off.pk).error_code == "hardware_error"


def test_max_restarts_reached_fails_with_the_last_fault_and_the_normal_refund_rule(
    submit, cloud, billed
):
    job, _ = running(submit, max_restarts=1)
    machine_lost(cloud, job)
    tasks.provision_job(job_id=job.pk)
    drive(job, S.CONFIGURING, S.RUNNING)
    TrainingJob.objects.filter(pk=job.pk).update(last_heartbeat_at=timezone.now())
    Instance.objects.filter(job=job).update(launched_at=timezone.now() - timedelta(hours=1))
    machine_lost(cloud, job)
    job.refresh_from_db()
    assert (job.status, job.error_code, job.attempt) == (S.FAILED, "worker_failed", 2)
    tasks.settle_job(job_id=job.pk)
    job.refresh_from_db()
    assert job.refund.status == "pending"  # worker_failed is reviewed before any credit
    lost = sum(
        LedgerEntry.objects.filter(job=job, kind="refund_credit").values_list(
            "amount_micros", flat=True
        )
    )
    assert job.refund.amount_micros == job.billing.cost_micros - lost


MINUTE = timedelta(minutes=1)


@pytest.mark.parametrize(
    "ran, checkpoint_after, kept_minutes, lost_minutes",
    [
        (50 * MINUTE, 30 * MINUTE, 30, 20),  # checkpointed 20 minutes before the machine died
        (50 * MINUTE, None, 0, 50),  # no checkpoint in this run: all of it is lost
        (50 * MINUTE, 50 * MINUTE, 50, 0),  # died just as it checkpointed
    ],
)
def test_a_restarted_jobs_charge_and_credit_are_its_kept_and_lost_compute(
    submit, cloud, billed, ran, checkpoint_after, kept_minutes, lost_minutes
):
    job, worker = running(submit)
    start = timezone.now() - ran
    Instance.objects.filter(job=job).update(launched_at=start)
    if checkpoint_after is not None:
        upload_checkpoint(worker, job, 10)
        Checkpoint.objects.filter(job=job).update(created_at=start + checkpoint_after)
    machine_lost(cloud, job)
    tasks.provision_job(job_id=job.pk)
    second_start = timezone.now() - 40 * MINUTE
    Instance.objects.filter(job=job).update(launched_at=second_start)
    drive(job, S.CONFIGURING, S.RUNNING, S.COMPLETED)
    tasks.settle_job(job_id=job.pk)
    tasks.settle_job(job_id=job.pk)  # a second settle changes nothing

    job.refresh_from_db()
    [run] = JobAttempt.objects.filter(job=job)
    per_minute = L4_PER_HOUR / 60
    # The machine was found lost when the watchdog ran, the test's own seconds past `ran`
    # (a busy machine's quarter second is 50 micro-dollars): lost compute, as the run's.
    overrun = (run.ended_at - (start + ran)) / MINUTE
    assert run.kept_micros == pytest.approx(kept_minutes * per_minute, abs=50)
    assert run.lost_micros == pytest.approx((lost_minutes + overrun) * per_minute, abs=50)
    final_run = Instance.objects.get(job=job).accrued_micros()
    assert job.billing.cost_micros == run.kept_micros + run.lost_micros + final_run
    entries = dict(LedgerEntry.objects.filter(job=job).values_list("kind", "amount_micros"))
    assert entries["job_charge"] == -job.billing.cost_micros
    assert entries.get("refund_credit", 0) == run.lost_micros
    assert not Refund.objects.filter(job=job).exists()  # it completed: nothing else is owed


def test_a_runs_compute_is_kept_until_its_checkpoint_and_lost_after():
    start = timezone.now()
    split = lambda **kw: split_run(  # noqa: E731
        price_per_hour_micros=3_600_000, launched_at=start, **kw
    )
    assert split(ended_at=start + 100 * timedelta(seconds=1), checkpoint_at=None) == (0, 100_000)
    kept_lost = split(
        ended_at=start + timedelta(seconds=100), checkpoint_at=start + timedelta(seconds=60)
    )
    assert kept_lost == (60_000, 40_000)
    # a checkpoint from before this run started (the one it resumed from) keeps nothing of it
    assert split(
        ended_at=start + timedelta(seconds=10), checkpoint_at=start - timedelta(seconds=5)
    ) == (0, 10_000)


def test_a_cancel_during_a_restart_terminates_everything_once(submit, cloud, api_client):
    job, _ = running(submit)
    machine_lost(cloud, job)
    assert api_client.post(f"/v1/training_jobs/{job.public_id}/cancel").json()["status"] == (
        "cancelled"
    )
    assert tasks.provision_job(job_id=job.pk).startswith("not claimed")
    assert cloud.terminated == ["i-0001"] and len(cloud.launched) == 1


def test_a_slow_but_healthy_worker_and_one_failed_poll_are_not_restarted(submit, cloud):
    job, worker = running(submit)
    worker.post(w(job, "heartbeat"), {"step": 3}, format="json")
    # The provider's status API fails once: no evidence, no restart.
    cloud.states_error = ProviderError("503 Service Unavailable")
    assert tasks.check_jobs() == {}
    cloud.states_error = None
    # Ten minutes on one step, heartbeats still coming: slow, not dead.
    later = timezone.now() + timedelta(minutes=10)
    TrainingJob.objects.filter(pk=job.pk).update(last_heartbeat_at=later - timedelta(seconds=5))
    assert tasks.check_jobs(now=later) == {}
    assert TrainingJob.objects.get(pk=job.pk).status == S.RUNNING


def replayed(submit, cloud, *, loss_before: float, loss_now: float) -> TrainingJob:
    """A job that reported step 21 after its checkpoint at 20, lost its machine, and whose next
    run reported step 21 again."""
    job, worker = running(submit)
    upload_checkpoint(worker, job, 20)
    point = lambda loss: {"points": [{"step": 21, "values": {"loss": loss}}]}  # noqa: E731
    worker.post(w(job, "metrics"), point(loss_before), format="json")
    machine_lost(cloud, job)
    tasks.provision_job(job_id=job.pk)
    new_worker = worker_client(TrainingJob.objects.get(pk=job.pk))
    new_worker.post(w(job, "register"), registration(), format="json")
    new_worker.post(w(job, "metrics"), point(loss_now), format="json")
    return job


def test_the_replayed_step_after_a_restart_is_checked_against_the_earlier_run(submit, cloud):
    job = replayed(submit, cloud, loss_before=0.5, loss_now=0.5003)
    verified = JobEvent.objects.get(job=job, type="resume_verified").detail
    assert (verified["step"], verified["loss_before"], verified["loss_now"]) == (21, 0.5, 0.5003)

    other = replayed(submit, cloud, loss_before=0.5, loss_now=0.9)
    assert JobEvent.objects.filter(job=other, type="resume_mismatch").exists()
    alarm = JobEvent.objects.get(job=other, type="alarm_resume_mismatch").detail
    assert "not the same training" in alarm["message"]


def test_mounted_files_are_pinned_at_submit_for_every_run(submit, cloud, workspace, api_client):
    fill_volume(workspace, "corpus", {"part-1.jsonl": b'{"v": 1}\n'})
    pinned_key = VolumeFile.objects.get(volume__name="corpus").object_key
    job, worker = running(submit, volumes=["corpus"])
    assert len(job.inputs_digest) == 64
    fill_volume(workspace, "corpus", {"part-1.jsonl": b'{"v": 2, "longer": true}\n'})  # replaced
    reconcile_deleted_volumes()  # the replaced object stays: a running job pinned it

    def mounted(client) -> tuple[int, bytes]:
        [volume] = client.post(w(job, "volume-credentials"), format="json").json()["volumes"]
        [file] = volume["files"]
        return file["size"], get_url(client, file["url"])

    assert mounted(worker) == (9, b'{"v": 1}\n')
    machine_lost(cloud, job)  # the restarted run reads the same bytes
    tasks.provision_job(job_id=job.pk)
    new_worker = worker_client(TrainingJob.objects.get(pk=job.pk))
    assert mounted(new_worker) == (9, b'{"v": 1}\n')
    got = api_client.get(f"/v1/training_jobs/{job.public_id}").json()
    assert got["inputs_digest"] == job.inputs_digest

    drive(job, S.CONFIGURING, S.RUNNING, S.COMPLETED)
    tasks.settle_job(job_id=job.pk)  # the job lets go: the old version may now leave the store
    reconcile_deleted_volumes()
    assert get_store().head(pinned_key) is None


@pytest.mark.django_db
def test_the_control_plane_shows_a_notice_once_per_run_and_restarts_nothing(submit, cloud):
    job, worker = running(submit)
    notice = {"source": "aws", "terminates_at": "2026-12-03T12:02:00Z"}
    for _ in range(2):  # a worker that reports twice shows one notice
        assert worker.post(w(job, "notice"), notice, format="json").status_code == 200
    [event] = JobEvent.objects.filter(job=job, type="preemption_notice")
    assert event.detail["source"] == "aws" and event.detail["attempt"] == 1
    assert event.detail["terminates_at"].startswith("2026-12-03T12:02:00")
    assert tasks.check_jobs() == {}  # the machine still answers: a notice alone restarts nothing
    job.refresh_from_db()
    assert job.status == JobStatus.RUNNING

    for hostile in ({"source": "evil"}, {"source": "aws", "terminates_at": "soon"}, ["aws"]):
        answer = worker.post(w(job, "notice"), hostile, format="json")
        assert answer.status_code == 400 and answer.json()["error"]["code"], answer.json()
    other, _ = running(submit)
    answer = worker_client(other).post(w(job, "notice"), notice, format="json")
    assert answer.status_code == 404  # a token reaches its own job only
    assert JobEvent.objects.filter(type="preemption_notice").count() == 1


def test_a_restart_its_provider_cannot_place_moves_to_another_with_the_gpu(submit, cloud, settings):
    settings.VERI_PROVIDER_ADAPTERS = settings.VERI_PROVIDER_ADAPTERS | {
        "vast": "tests.training.fakes.OtherFakeCloud"
    }
    other = get_adapter("vast")
    other.reset()
    job, worker = running(submit, gpu_type="H100-80GB", region="us-east-1")
    upload_checkpoint(worker, job, 10)
    machine_lost(cloud, job)
    for zone in catalog.get_provider("aws").zones["us-east-1"]:
        cloud.outcomes[zone] = CapacityError("InsufficientInstanceCapacity")
    assert tasks.provision_job(job_id=job.pk) == "moved to vast"
    assert tasks.provision_job(job_id=job.pk) == "launched"
    job.refresh_from_db()
    assert (job.provider, job.status, job.resume_from.step) == ("vast", S.PROVISIONING, 10)
    assert JobEvent.objects.get(job=job, type="provider_switched").detail == {
        "from": "aws",
        "to": "vast",
        "attempt": 2,
    }
    [launch] = other.launched
    assert launch.gpu_type == "H100-80GB" and launch.region == "us-east-1"


def test_a_first_launch_without_capacity_fails_as_before(submit, cloud, settings):
    settings.VERI_PROVIDER_ADAPTERS = settings.VERI_PROVIDER_ADAPTERS | {
        "vast": "tests.training.fakes.OtherFakeCloud"
    }
    job = submit(gpu_type="H100-80GB", region="us-east-1")
    for zone in catalog.get_provider("aws").zones["us-east-1"]:
        cloud.outcomes[zone] = CapacityError("InsufficientInstanceCapacity")
    assert tasks.provision_job(job_id=job.pk) == "CAPACITY_UNAVAILABLE"
    job.refresh_from_db()
    assert (job.provider, job.status) == ("aws", S.FAILED)


def stepping(submit, *, gpu_count: int, gap: timedelta):
    """A running job that made steps 1-6 `gap` apart, the last one now."""
    job, worker = running(submit, gpu_type="L4-24GB", gpu_count=gpu_count)
    now = timezone.now()
    points = [
        {"step": step, "values": {"loss": 1.0}, "at": (now - (6 - step) * gap).isoformat()}
        for step in range(1, 7)
    ]
    worker.post(w(job, "metrics"), {"points": points}, format="json")
    return job, now


def alive_at(job, when) -> dict:
    """The watchdog's tick at `when`, with the worker's heartbeat still fresh then."""
    TrainingJob.objects.filter(pk=job.pk).update(last_heartbeat_at=when - timedelta(seconds=5))
    return tasks.check_jobs(now=when)


def test_a_multi_gpu_job_without_a_step_past_the_stall_window_is_training_stalled(submit, cloud):
    job, last_step = stepping(submit, gpu_count=4, gap=timedelta(seconds=30))
    assert alive_at(job, last_step + timedelta(minutes=9)) == {}
    assert alive_at(job, last_step + timedelta(minutes=11)) == {"training_stalled": 1}
    job.refresh_from_db()
    assert (job.status, job.error_code, job.attempt) == (S.FAILED, "training_stalled", 1)
    assert "(last step 6) while the worker still answers" in job.error_message


def test_a_slow_but_progressing_multi_gpu_job_is_not_stalled(submit, cloud):
    # Five minutes a step: the window is three times that, not ten minutes.
    job, last_step = stepping(submit, gpu_count=4, gap=timedelta(minutes=5))
    assert alive_at(job, last_step + timedelta(minutes=14)) == {}
    assert alive_at(job, last_step + timedelta(minutes=16)) == {"training_stalled": 1}
    # One GPU: no stall rule (its worker's silence is what counts).
    single, last_step = stepping(submit, gpu_count=1, gap=timedelta(seconds=30))
    assert alive_at(single, last_step + timedelta(hours=1)) == {}
