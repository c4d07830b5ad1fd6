"""The new-job form: defaults shown, a live quote, values (and files) kept after an error, Clone."""

import html
import json
import re

from django.core.files.uploadedfile import SimpleUploadedFile

from tests.dashboard.conftest import member_of, signed_in
from tests.training.conftest import GRPO_ROWS
from training.models import Dataset, TrainingJob
from veri import services

REWARD = b"def reward(completions, **kwargs):\n    return [1.0 for _ in completions]\n"


def rows_file(name="rows.jsonl") -> SimpleUploadedFile:
    return SimpleUploadedFile(name, "".join(json.dumps(row) + "\n" for row in GRPO_ROWS).encode())


def field_value(page: str, name: str) -> str | None:
    match = re.search(rf'<input[^>]*name="{name}"[^>]*value="([^"]*)"', page)
    return html.unescape(match.group(1)) if match else None


def selected(page: str, name: str) -> str | None:
    select = re.search(rf'<select name="{name}".*?</select>', page, re.S)
    match = re.search(r'<option value="([^"]*)"[^>]*selected', select.group(0)) if select else None
    return match.group(1) if match else None


def test_the_form_shows_each_default_and_gpus_as_the_catalog_names_them(browser, cloud):
    page = browser.get("/jobs/new/").content.decode()
    assert 'name="max_steps"' in page and 'placeholder="50"' in page  # GRPO's max_steps
    assert 'placeholder="1e-05"' in page and "default: 16" in page  # learning rate, batch size
    assert "&quot;max_response_length&quot;: 256" in page  # the others, as JSON
    assert '<optgroup label="aws">' in page and '<optgroup label="local">' in page
    assert re.search(r'<option value="local:cpu"[^>]*>local · cpu · [\d.]+ USD per GPU-hour', page)
    assert "This machine" not in page
    assert 'id="method-defaults"' in page and "none: 1 epoch(s)" in page  # SFT's, for the script


def test_the_quote_follows_the_gpu_count(browser, dataset, cloud):
    fields = {
        "method": "grpo",
        "base_model": "tiny/model",
        "dataset": dataset["id"],
        "gpu": "aws:L4-24GB",
        "max_steps": "50",
    }
    one = browser.post("/jobs/new/quote.json", fields).json()
    two = browser.post("/jobs/new/quote.json", {**fields, "gpu_count": "2"}).json()
    assert "1x L4-24GB (aws, us-east-1)" in one["quote"], one
    # Amounts as the dashboard writes them everywhere: four decimals.
    assert re.match(r"\d+\.\d{4} to \d+\.\d{4} USD, expected \d+\.\d{4} USD", one["quote"])
    assert "2x L4-24GB" in two["quote"], two
    price = re.compile(r"at ([\d.]+) USD/hour")
    assert float(price.search(two["quote"])[1]) == 2 * float(price.search(one["quote"])[1])
    missing = browser.post("/jobs/new/quote.json", {**fields, "dataset": ""}).json()
    assert "Pick a dataset" in missing["error"]
    fresh = browser.post("/jobs/new/quote.json", {**fields, "base_model": ""}).json()
    assert fresh["error"] == "Fill in base model to see a quote."
    bad = browser.post("/jobs/new/quote.json", {**fields, "learning_rate": "7"}).json()
    assert "learning_rate" in bad["error"] and bad["field"] == "learning_rate"
    assert not TrainingJob.objects.exists()


def test_an_error_keeps_every_value_and_both_files(browser, billed, cloud):
    fields = {
        "method": "grpo",
        "base_model": "../etc",
        "gpu": "aws:L4-24GB",
        "gpu_count": "2",
        "max_steps": "7",
        "hyperparameters": '{"max_response_length": 12}',
        "checkpoint_every": "3",
        "output_name": "kept",
    }
    files = {"dataset_file": rows_file(), "reward_file": SimpleUploadedFile("mine.py", REWARD)}
    response = browser.post("/jobs/new/", {**fields, **files})
    assert response.status_code == 200
    page = response.content.decode()
    assert "base_model" in response.context["form"].errors
    uploaded = Dataset.objects.get(workspace=billed)
    assert selected(page, "dataset") == uploaded.public_id
    assert f"rows.jsonl was uploaded as {uploaded.public_id}, selected below" in page
    assert "mine.py is kept; choose a file only to replace it" in page
    for name in ("max_steps", "gpu_count", "checkpoint_every", "output_name"):
        assert field_value(page, name) == fields[name], name
    assert selected(page, "gpu") == "aws:L4-24GB"
    assert field_value(page, "reward_source") == REWARD.decode()
    # What the browser sends back: the page's values, no files; fixed, it submits.
    again = {**fields, "base_model": "tiny/model", "dataset": uploaded.public_id}
    again |= {"reward_source": field_value(page, "reward_source"), "reward_name": "mine.py"}
    response = browser.post("/jobs/new/", again)
    assert response.status_code == 302, response.context["form"].errors
    job = TrainingJob.objects.get()
    assert job.reward_source == REWARD.decode() and job.dataset == uploaded
    assert job.gpu_count == 2 and job.checkpoint_every == 3
    assert job.hyperparameters["max_steps"] == 7
    assert job.hyperparameters["max_response_length"] == 12


def test_a_bad_upload_says_to_choose_the_file_again(browser, cloud):
    fields = {"method": "grpo", "base_model": "tiny/model", "gpu": "aws:L4-24GB"}
    bad = SimpleUploadedFile("rows.jsonl", b"{not json\n")
    response = browser.post("/jobs/new/", {**fields, "dataset_file": bad})
    assert response.status_code == 200
    assert "Choose the file again once fixed." in response.content.decode()
    assert not Dataset.objects.exists()


def test_clone_fills_the_form_with_the_jobs_values(browser, submit):
    source = submit(
        gpu_count=2,
        checkpoint_every=4,
        output_name="first",
        hyperparameters={"max_steps": 9, "learning_rate": 0.01, "max_response_length": 16},
        lora={"r": 8},
    )
    page = browser.get(f"/jobs/new/?clone={source.public_id}").content.decode()
    assert f"Filled in from {source.public_id}" in page
    assert selected(page, "gpu") == "aws:L4-24GB" and selected(page, "method") == "grpo"
    assert selected(page, "dataset") == source.dataset.public_id
    assert field_value(page, "base_model") == "tiny/model"
    assert field_value(page, "max_steps") == "9" and field_value(page, "learning_rate") == "0.01"
    assert field_value(page, "gpu_count") == "2" and field_value(page, "checkpoint_every") == "4"
    assert field_value(page, "output_name") == "first"
    assert field_value(page, "reward_source") == source.reward_source
    assert "&quot;max_response_length&quot;: 16" in page
    assert "&quot;r&quot;: 8" in page
    assert "Not on this form" not in page


def test_clone_says_what_the_form_cannot_carry(browser, submit, dataset):
    source = submit(validation_dataset_id=dataset["id"])
    page = browser.get(f"/jobs/new/?clone={source.public_id}").content.decode()
    assert "Not on this form, so not cloned: its validation dataset." in page


def test_clone_of_another_workspaces_job_is_404(submit, db):
    job = submit()
    other, _ = services.create_workspace(name="other")
    stranger = signed_in(member_of(other, "stranger@other.test"))
    assert stranger.get(f"/jobs/new/?clone={job.public_id}").status_code == 404
    assert stranger.get("/jobs/new/?clone=job_nope").status_code == 404
