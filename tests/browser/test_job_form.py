"""The new-job form in a real browser: each default shown (and swapped with the method), a live
quote that follows the GPU count, every value and both files kept after an error, and Clone
filling the form with the source job's values."""

import json
import re

import pytest
from playwright.sync_api import expect

from tests.browser.test_dashboard import EMAIL, screenshots_dir, sign_in
from tests.browser.test_refund_review import browser_page  # noqa: F401 - the Chromium page
from tests.dashboard.conftest import member_of
from tests.training.conftest import GRPO_ROWS
from training.models import TrainingJob

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True, serialized_rollback=True)]

REWARD = "def reward(completions, **kwargs):\n    return [1.0 for _ in completions]\n"


def test_defaults_a_live_quote_and_values_kept_after_an_error(
    live_server,
    browser_page,  # noqa: F811
    billed,
    cloud,
    settings,
    local_store_url,
    tmp_path,
):
    settings.VERI_STORE = local_store_url
    member_of(billed, EMAIL)
    page = browser_page
    sign_in(page, live_server.url)
    page.goto(f"{live_server.url}/jobs/new/")
    expect(page.locator("#id_max_steps")).to_have_attribute("placeholder", "50")
    expect(page.locator("[data-default-hint=learning_rate]")).to_have_text("default: 1e-05")
    page.select_option("#id_method", "sft_text")
    expect(page.locator("#id_max_steps")).to_have_attribute("placeholder", "none: 1 epoch(s)")
    expect(page.locator("[data-default-hint=learning_rate]")).to_have_text("default: 0.0002")
    page.select_option("#id_method", "grpo")

    quote = page.locator("#quote")
    expect(quote).to_have_text("Fill in base model to see a quote.")
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps(row) + "\n" for row in GRPO_ROWS))
    reward = tmp_path / "mine.py"
    reward.write_text(REWARD)
    page.set_input_files("#id_dataset_file", str(rows))
    page.set_input_files("#id_reward_file", str(reward))
    page.fill("#id_base_model", "../etc")  # refused by submit: the error comes back
    page.select_option("#id_gpu", "aws:L4-24GB")
    page.fill("#id_max_steps", "40")
    page.fill("#id_output_name", "kept")
    page.click("button:has-text('Submit the job')")

    expect(page.locator(".field.invalid #id_base_model")).to_have_value("../etc")
    expect(page.locator("[data-kept]")).to_contain_text(
        ["rows.jsonl was uploaded as ds_", "mine.py is kept"]
    )
    expect(page.locator("#id_max_steps")).to_have_value("40")
    expect(page.locator("#id_output_name")).to_have_value("kept")
    expect(page.locator("#id_gpu")).to_have_value("aws:L4-24GB")
    expect(page.locator("#id_dataset")).to_have_value(re.compile(r"^ds_"))

    page.fill("#id_base_model", "tiny/model")
    expect(quote).to_contain_text("1x L4-24GB (aws, us-east-1)")
    one = quote.inner_text()
    page.fill("#id_gpu_count", "4")
    expect(quote).to_contain_text("4x L4-24GB")
    assert quote.inner_text() != one
    page.screenshot(path=str(screenshots_dir(tmp_path) / "job-new.png"), full_page=True)

    page.click("button:has-text('Submit the job')")  # no file chosen again: the kept ones
    expect(page).to_have_url(re.compile(r"/jobs/job_\w+/$"))
    job = TrainingJob.objects.get()
    assert job.reward_source == REWARD and job.gpu_count == 4 and job.output_name == "kept"
    assert job.hyperparameters["max_steps"] == 40


def test_clone_fills_the_form_with_the_source_jobs_values(
    live_server,
    browser_page,  # noqa: F811
    billed,
    submit,
):
    member_of(billed, EMAIL)
    source = submit(
        gpu_count=2,
        checkpoint_every=5,
        output_name="first run",
        hyperparameters={"max_steps": 12, "learning_rate": 0.003, "max_response_length": 24},
    )
    page = browser_page
    sign_in(page, live_server.url)
    page.goto(f"{live_server.url}/jobs/new/?clone={source.public_id}")
    expect(page.locator("[data-kept]").first).to_contain_text(f"Filled in from {source.public_id}")
    expect(page.locator("#id_method")).to_have_value("grpo")
    expect(page.locator("#id_base_model")).to_have_value("tiny/model")
    expect(page.locator("#id_dataset")).to_have_value(source.dataset.public_id)
    expect(page.locator("#id_gpu")).to_have_value("aws:L4-24GB")
    expect(page.locator("#id_gpu_count")).to_have_value("2")
    expect(page.locator("#id_max_steps")).to_have_value("12")
    expect(page.locator("#id_learning_rate")).to_have_value("0.003")
    expect(page.locator("#id_checkpoint_every")).to_have_value("5")
    expect(page.locator("#id_output_name")).to_have_value("first run")
    expect(page.locator("#id_hyperparameters")).to_contain_text('"max_response_length": 24')
    expect(page.locator("#quote")).to_contain_text("2x L4-24GB")
    page.click("button:has-text('Submit the job')")
    expect(page).to_have_url(re.compile(r"/jobs/job_\w+/$"))
    clone = TrainingJob.objects.exclude(pk=source.pk).get()
    assert clone.reward_source == source.reward_source
    assert clone.hyperparameters == source.hyperparameters and clone.gpu_count == 2
