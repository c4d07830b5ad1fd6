"""Quotes through the clients against a live server: `client.training_jobs.quote(...)` and
`veri jobs quote` show the figures the API's quote gives, and rent nothing."""

import json

import httpx
import pytest

from providers.models import Instance
from tests.sdk.test_training_cli import job_fields
from tests.training.conftest import REWARD
from training.models import TrainingJob
from veri_sdk import Client

pytestmark = pytest.mark.django_db(transaction=True)


def api_quote(cli, fields: dict) -> dict:
    """The quote straight from the HTTP API, with the same key."""
    answer = httpx.post(
        f"{cli.url}/v1/training_jobs/quote",
        json=fields,
        headers={"Authorization": f"Bearer {cli.key}"},
    )
    assert answer.status_code == 200, answer.text
    return answer.json()


def test_the_sdk_and_the_cli_quote_what_the_api_quotes(cli, capsys, account, tmp_path):
    client = Client()
    fields = job_fields(client, tmp_path, max_cost_usd="5")
    expected = api_quote(cli, fields)
    assert expected["price_per_hour_usd"] == "0.805" and expected["max_cost_usd"] == "5.00"

    assert client.training_jobs.quote(**fields) == expected

    (tmp_path / "reward.py").write_text(REWARD)
    job_file = tmp_path / "job.toml"
    job_file.write_text(
        'kind = "train"\nbase_model = "tiny/model"\n'
        f'dataset = "{fields["dataset_id"]}"\nmethod = "grpo"\nreward = "reward.py"\n'
        'gpu_type = "L4-24GB"\nmax_cost_usd = "5"\n\n[hyperparameters]\nmax_steps = 5\n'
    )
    code, out, _ = cli("jobs", "quote", str(job_file), "--json", capsys=capsys)
    assert code == 0 and json.loads(out) == expected

    code, out, _ = cli("jobs", "quote", str(job_file), capsys=capsys)
    costs, seconds = expected["cost_usd"], expected["gpu_seconds"]
    assert code == 0
    assert f"1x L4-24GB on aws in {expected['region']} at 0.805 USD/hour" in out
    assert f"cost {costs['low']}-{costs['high']} USD (expected {costs['expected']})" in out
    assert f"(expected {seconds['expected'] // 60} min)" in out and "capped at 5.00 USD" in out
    assert not TrainingJob.objects.exists() and not Instance.objects.exists()
