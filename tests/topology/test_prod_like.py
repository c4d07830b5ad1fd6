"""The production topology (gunicorn, qclusters on Redis, PostgreSQL, an S3 store) keeps the
control plane's promises with pieces failing: one launch per job, one charge, no lost work, no
lost or doubled log line, a clean 503 for a lost database, nothing half-recorded."""

import json
import sys
import threading
import time
from datetime import timedelta

import httpx
import psycopg
import pytest
from django.utils import timezone
from django_q.models import Schedule

from billing.models import LedgerEntry
from billing.services import balance_micros
from providers.local import LocalProvider
from providers.models import Instance, LaunchAttempt
from tests.conftest import fill_volume, postgres_only, wait_for
from tests.e2e.conftest import database_url
from tests.e2e.test_training import FAST_LORA, SFT_ROWS
from training.models import JobEvent, TrainingJob, WatchdogState
from veri_sdk.volumes import UploadFailed

pytestmark = [
    pytest.mark.slow,
    postgres_only,
    pytest.mark.django_db(transaction=True, serialized_rollback=True),
]
REAL_WORKER = f"{sys.executable} -m worker"


def settled(job_id: str, timeout: float = 180) -> TrainingJob:
    return wait_for(
        lambda: TrainingJob.objects.filter(public_id=job_id, settled_at__isnull=False).first(),
        timeout,
        f"{job_id} to be settled",
    )


def write_rows(folder, rows) -> str:
    path = folder / "train.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def stub_job(veri, workspace, tmp_path) -> dict:
    """What a job with the stub worker needs: a model folder in a volume and a dataset."""
    fill_volume(workspace, "models", {"tiny/config.json": b"{}"})
    dataset = veri.datasets.upload(write_rows(tmp_path, SFT_ROWS))
    return {"base_model": "volume://models/tiny", "dataset_id": dataset.id, "method": "sft_text"}


def restart_cluster(topology) -> None:
    """Start a cluster in place of a killed one. Killed mid-tick, it lost the watchdog's tick
    chain, which the every-minute watch schedule starts again once no tick ran for 30 s: the
    last tick is dated 30 s back, and each scheduler pass of the new cluster (as it starts, then
    every 30 s) finds that minute over, so the chain starts at once instead of a pass or two
    later. (A chain that outlived the kill ends at its next tick, superseded.)"""
    WatchdogState.objects.update(last_tick_at=timezone.now() - timedelta(seconds=30))
    watch = Schedule.objects.filter(func="training.tasks.watch_jobs")
    watch.update(next_run=timezone.now())
    before = watch.values_list("task", flat=True).get()
    topology.start_cluster()
    wait_for(lambda: watch.exclude(task=before).exists(), 60, "the cluster's first pass")
    watch.update(next_run=timezone.now())


def charges(job_id: str) -> list[LedgerEntry]:
    return list(LedgerEntry.objects.filter(job__public_id=job_id, kind="job_charge"))


def test_real_jobs_uploads_and_cancels_run_through_the_topology_and_logs_survive_a_web_restart(
    prod_like, customer, tiny_model, tmp_path
):
    topology = prod_like(worker=REAL_WORKER)
    health = httpx.get(f"{topology.url}/healthz").json()
    assert {k: health[k] for k in ("database", "broker", "store")} == dict.fromkeys(
        ("database", "broker", "store"), "ok"
    )
    veri = customer(topology)
    veri.volumes.create("models")
    uploaded = veri.volumes.upload_dir("models", tiny_model, prefix="tiny")
    assert len(uploaded.uploaded) == len([p for p in tiny_model.iterdir() if p.is_file()])
    dataset = veri.datasets.upload(write_rows(tmp_path, SFT_ROWS))
    spec = {
        "base_model": "volume://models/tiny",
        "dataset_id": dataset.id,
        "method": "sft_text",
        "gpu_type": "cpu",
        "lora": FAST_LORA,
    }
    job = veri.training_jobs.create(**spec, hyperparameters={"max_steps": 40})
    # Long enough to be still training when it is cancelled, however slow the other job is.
    doomed = veri.training_jobs.create(**spec, hyperparameters={"max_steps": 20_000})

    # The web server goes down for a few seconds while the worker is shipping step lines.
    wait_for(
        lambda: any("step 3/40" in t for t in veri.training_jobs.log_lines(job.id)),
        180,
        "training to log its third step",
    )
    topology.stop_web()
    time.sleep(4)
    topology.start_web()
    assert veri.training_jobs.cancel(doomed.id).status == "cancelled"

    finished = veri.training_jobs.wait(job.id, stream=False, poll_interval=1, timeout=240)
    assert finished.status == "completed", finished.data
    lines, after = [], -1
    while page := veri.training_jobs.logs(job.id, after=after)["lines"]:
        lines += page
        after = page[-1]["seq"]
    assert [line["seq"] for line in lines] == list(range(len(lines)))  # none lost, none twice
    step_lines = [line["text"].split()[1] for line in lines if line["text"].startswith("step ")]
    assert step_lines == [f"{n}/40" for n in range(1, 41)]
    [charge] = charges(job.id)
    assert -charge.amount_micros == settled(job.id).billing.cost_micros > 0
    [final] = [c for c in veri.training_jobs.checkpoints(job.id) if c["final"]]
    assert "adapter_model.safetensors" in {f["path"] for f in final["files"]}

    cancelled = settled(doomed.id)
    assert cancelled.status == "cancelled"
    assert Instance.objects.get(job=cancelled).terminated_at is not None
    assert not LocalProvider().tagged_instances()  # no machine left running


def test_a_task_worker_killed_while_launching_gets_the_job_launched_once(
    prod_like, customer, workspace, tmp_path
):
    topology = prod_like(clusters=1, VERI_LAUNCH_STALL_SECONDS="3")
    veri = customer(topology)
    spec = stub_job(veri, workspace, tmp_path)
    topology.public_proxy.hold_next = [4]  # the launcher's check of the API server hangs
    job = veri.training_jobs.create(**spec)
    wait_for(
        lambda: Instance.objects.filter(job__public_id=job.id, external_id="").exists(),
        60,
        "the launch to reserve its machine",
    )
    topology.stop_cluster(topology.clusters[0], kill=True)
    restart_cluster(topology)

    done = settled(job.id)
    assert done.status == "completed", done.error_message
    assert LaunchAttempt.objects.filter(job=done, outcome="launched").count() == 1
    assert JobEvent.objects.filter(job=done, type="launch_retried").count() == 1
    worker_log = (topology.run_dir / "instances" / job.id / "worker.log").read_text()
    assert worker_log.count("stub worker starting") == 1  # one machine, started once
    assert not LocalProvider().tagged_instances()
    assert len(charges(job.id)) == 1


def test_a_task_worker_killed_while_settling_charges_once(prod_like, customer, workspace, tmp_path):
    topology = prod_like(clusters=1, VERI_SETTLE_RETRY_SECONDS="3")
    veri = customer(topology)
    spec = stub_job(veri, workspace, tmp_path)
    # The ledger is locked, as a long migration or a stuck transaction would: settling gets as far
    # as writing the charge and waits there.
    with psycopg.connect(database_url()) as blocker:
        blocker.execute("LOCK TABLE billing_ledgerentry IN EXCLUSIVE MODE")
        job = veri.training_jobs.create(**spec)
        wait_for(
            lambda: TrainingJob.objects.filter(
                public_id=job.id, billing__cost_attributed_at__isnull=False
            ).exists(),
            120,
            "settling to attribute the job's cost",
        )
        waiting_on_ledger = (
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
            "AND query ILIKE '%billing_ledgerentry%'"
        )
        wait_for(
            lambda: (
                psycopg.connect(database_url(), autocommit=True)
                .execute(waiting_on_ledger)
                .fetchone()[0]
            ),
            30,
            "the charge to wait on the ledger",
        )
        topology.stop_cluster(topology.clusters[0], kill=True)
        blocker.rollback()
    assert TrainingJob.objects.get(public_id=job.id).billing.billing_deducted_at is None
    restart_cluster(topology)

    done = settled(job.id, timeout=150)
    assert done.status == "completed"
    [charge] = charges(job.id)
    assert -charge.amount_micros == done.billing.cost_micros > 0
    assert balance_micros(workspace=workspace) == 100_000_000 - done.billing.cost_micros


def test_queued_work_survives_a_redis_restart_and_a_submit_while_it_is_down(
    prod_like, customer, workspace, tmp_path
):
    topology = prod_like(clusters=0)  # no task worker yet: the launch waits in Redis
    veri = customer(topology)
    spec = stub_job(veri, workspace, tmp_path)
    queued = veri.training_jobs.create(**spec)
    topology.stop_redis(kill=True)
    answer = httpx.get(f"{topology.url}/healthz")
    assert answer.status_code == 503 and answer.json()["broker"].startswith("error")
    while_down = veri.training_jobs.create(**spec)  # accepted; queued once Redis is back
    assert while_down.status == "queued"
    topology.start_redis()
    topology.start_cluster()

    for job_id in (queued.id, while_down.id):
        done = settled(job_id, timeout=150)
        assert done.status == "completed", done.error_message
        assert LaunchAttempt.objects.filter(job=done, outcome="launched").count() == 1
        assert len(charges(job_id)) == 1


def test_a_lost_database_answers_503_in_the_error_format_and_the_sdk_retries(
    prod_like, customer, workspace
):
    topology = prod_like(clusters=1)
    veri = customer(topology)
    key = veri.api.http.headers["Authorization"]
    topology.db_proxy.refusing = True
    topology.db_proxy.cut()  # the web workers' open connections drop; new ones are refused
    answer = httpx.post(
        f"{topology.url}/v1/volumes", json={"name": "during"}, headers={"Authorization": key}
    )
    assert answer.status_code == 503
    assert answer.json()["error"]["code"] == "database_unavailable"
    assert answer.headers["Retry-After"]
    assert httpx.get(f"{topology.url}/healthz").json()["database"].startswith("error")

    threading.Timer(3, lambda: setattr(topology.db_proxy, "refusing", False)).start()
    refused_before = topology.db_proxy.refused
    volume = veri.volumes.create("after")  # answered 503 until the database is back, then made
    assert volume.name == "after"
    assert topology.db_proxy.refused > refused_before
    assert [v.name for v in veri.volumes.list()] == ["after"]


def test_a_store_refusing_writes_fails_the_upload_and_records_nothing(
    prod_like, customer, tmp_path
):
    topology = prod_like(clusters=1)
    veri = customer(topology, max_retries=1)
    folder = tmp_path / "data"
    folder.mkdir()
    for n in range(5):
        (folder / f"part-{n}.jsonl").write_text(f'{{"n": {n}}}\n')
    veri.volumes.create("data")
    topology.store_proxy.refuse_http_method = b"PUT"
    with pytest.raises(UploadFailed) as failed:
        veri.volumes.upload_dir("data", folder)
    assert failed.value.code == "upload_failed" and "5 file(s) failed" in failed.value.message
    assert veri.volumes.files("data") == []
    assert veri.volumes.get("data").total_bytes == 0

    topology.store_proxy.refuse_http_method = None  # the store recovers: the same upload works
    result = veri.volumes.upload_dir("data", folder)
    assert len(result.uploaded) == 5
    assert sorted(f.path for f in veri.volumes.files("data")) == [
        f"part-{n}.jsonl" for n in range(5)
    ]
