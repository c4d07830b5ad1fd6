"""The run pages' server side: a running job's status.json says how far along it is and when it
should end, the list shows it, the metrics view is told why a metric is missing, and the
compare page sets runs' settings side by side, within the workspace only."""

import json
import re
from datetime import timedelta
from html import unescape

import pytest
from django.utils import timezone

from billing.services import open_billing_account
from tests.training.conftest import drive, job_body, upload_dataset
from training.models import JobAttempt, MetricPoint
from training.services.worker import record_metrics
from veri.models import Workspace

pytestmark = pytest.mark.django_db


def test_a_running_jobs_status_gives_step_of_total_elapsed_and_eta(browser, submit):
    job = drive(submit(hyperparameters={"max_steps": 60}), "provisioning", "configuring", "running")
    # Twenty steps, two seconds apart, the last one just now.
    now = timezone.now()
    MetricPoint.objects.bulk_create(
        MetricPoint(job=job, step=s, at=now - timedelta(seconds=2 * (20 - s)), values={})
        for s in range(1, 21)
    )
    job.last_step = 20
    job.save(update_fields=["last_step"])
    progress = browser.get(f"/jobs/{job.public_id}/status.json").json()["progress"]
    assert progress["step_text"] == "step 20 / 60"
    assert progress["percent"] == 33
    assert 70 < progress["eta_seconds"] <= 80  # 40 steps left at two seconds a step
    assert re.fullmatch(r"1m \d\ds", progress["eta_text"])
    assert progress["running"] is True
    page = browser.get(f"/jobs/{job.public_id}/").content.decode()
    assert "step 20 / 60" in page and 'value="33"' in page
    listed = browser.get("/jobs/").content.decode()
    assert "step 20 / 60" in listed
    assert re.search(r"data-progress-eta [^>]*>1m \d\ds<", listed)  # the page's ETAs, one query
    # Finished: the whole bar, the time it ran, no ETA.
    job = drive(job, "completed")
    progress = browser.get(f"/jobs/{job.public_id}/status.json").json()["progress"]
    assert (progress["percent"], progress["running"], progress["eta_text"]) == (100, False, "—")
    assert progress["elapsed_seconds"] >= 0


def test_a_job_with_no_known_total_says_so(browser, submit, api_client):
    texts = upload_dataset(api_client, [{"text": f"line {i}"} for i in range(8)], "text.jsonl")
    job = submit(method="sft_text", dataset_id=texts["id"], hyperparameters={"epochs": 1})
    job = drive(job, "provisioning", "configuring", "running")
    record_metrics(job=job, points=[{"step": 3, "values": {"loss": 1.0}}])
    progress = browser.get(f"/jobs/{job.public_id}/status.json").json()["progress"]
    assert progress["step_text"] == "step 3 (total unknown)"
    record_metrics(job=job, points=[{"step": 4, "values": {"loss": 1.0, "epoch": 0.5}}])
    progress = browser.get(f"/jobs/{job.public_id}/status.json").json()["progress"]
    assert progress["step_text"] == "step 4 / ≈8"


def test_the_metrics_view_is_told_why_kl_and_validation_loss_are_missing(browser, submit):
    job = submit(hyperparameters={"max_steps": 5, "kl_coef": 0.0})
    page = browser.get(f"/jobs/{job.public_id}/").content.decode()
    notes = json.loads(unescape(re.search(r'data-notes="([^"]*)"', page).group(1)))
    assert "kl_coef is 0" in notes["kl"]
    assert "no validation dataset" in notes["eval_loss"]
    with_kl = submit(hyperparameters={"max_steps": 5, "kl_coef": 0.1})
    page = browser.get(f"/jobs/{with_kl.public_id}/").content.decode()
    assert "kl" not in json.loads(unescape(re.search(r'data-notes="([^"]*)"', page).group(1)))


def test_compare_sets_two_runs_side_by_side_and_marks_what_differs(
    browser, submit, other_api_client
):
    a = submit(hyperparameters={"max_steps": 5, "learning_rate": 1e-5})
    b = submit(hyperparameters={"max_steps": 5, "learning_rate": 2e-5}, max_restarts=2)
    response = browser.get(f"/jobs/compare/?ids={a.public_id},{b.public_id}")
    assert response.status_code == 200
    rows = {row["name"]: row for row in response.context["rows"]}
    assert rows["hyperparameters.learning_rate"]["differs"]
    assert rows["hyperparameters.learning_rate"]["cells"] == [
        (a.public_id, "1e-05"),
        (b.public_id, "2e-05"),
    ]
    assert not rows["method"]["differs"] and not rows["hyperparameters.max_steps"]["differs"]
    assert rows["max restarts"]["cells"] == [(a.public_id, "3"), (b.public_id, "2")]
    assert rows["max restarts"]["differs"] and not rows["auto-resume"]["differs"]
    page = browser.get(f"/jobs/{b.public_id}/").content.decode()
    assert "on, up to 2 restarts" in page
    runs = [run["id"] for run in response.context["runs"]]
    assert runs == [a.public_id, b.public_id]
    # The jobs list's ticked boxes send ids=a&ids=b: the same page.
    ticked = browser.get("/jobs/compare/", {"ids": [a.public_id, b.public_id]})
    assert [run["id"] for run in ticked.context["runs"]] == runs

    # Another workspace's job, among mine or alone, is not found.
    other = Workspace.objects.get(name="other")
    open_billing_account(workspace=other, credit_micros=10_000_000)
    theirs = other_api_client.post(
        "/v1/training_jobs",
        job_body(upload_dataset(other_api_client, [{"prompt": "p"}])),
        format="json",
    ).json()["id"]
    assert browser.get(f"/jobs/compare/?ids={a.public_id},{theirs}").status_code == 404
    assert browser.get(f"/jobs/compare/?ids={theirs}").status_code == 404


def test_a_restarted_jobs_elapsed_time_counts_from_its_first_run(browser, submit):
    job = drive(submit(hyperparameters={"max_steps": 60}), "provisioning", "configuring", "running")
    now = timezone.now()
    # Its first run started ten minutes ago and a platform fault ended it; this run began now.
    JobAttempt.objects.create(
        job=job,
        number=1,
        cause="worker_failed",
        provider="local",
        gpu_type="cpu",
        gpu_count=1,
        price_per_hour_micros=0,
        launched_at=now - timedelta(minutes=10),
        ended_at=now - timedelta(minutes=1),
    )
    job.started_at = now
    job.save(update_fields=["started_at"])
    progress = browser.get(f"/jobs/{job.public_id}/status.json").json()["progress"]
    assert 600 <= progress["elapsed_seconds"] < 700
    assert progress["elapsed_text"].startswith("10m")
