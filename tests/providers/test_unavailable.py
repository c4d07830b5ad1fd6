# ruff: noqa: F811 - the fixtures imported below are parameters of these tests
"""A GPU provider's API that is away (nothing listening at its address) never makes a request 500:
a cancel, which must stop the machine before it answers, is 503 `provider_unavailable` with
`Retry-After` (in JSON on the API, as a page on the dashboard), and asking again once the provider
answers stops the machine; the catalog still answers, with availability unknown. One test per
provider, each against its HTTP fake (moto's EC2 for AWS) moved to a dead address."""

import pytest

from providers.aws import AwsProvider
from providers.gcp import GcpProvider
from scripts.prod_like import free_port
from tests.dashboard.conftest import member_of, signed_in
from tests.providers.conftest import instances, submit_aws
from tests.providers.test_aws import sft_dataset  # noqa: F401
from tests.providers.test_rest_providers import data, submit  # noqa: F401 - a fixture
from training import tasks
from training.models import TrainingJob

pytestmark = pytest.mark.django_db


def dead_url() -> str:
    return f"http://127.0.0.1:{free_port()}"  # a port nothing listens on: connection refused


def assert_unavailable(response, code: str = "provider_unavailable") -> dict:
    body = response.json()
    assert response.status_code == 503, body
    assert body["error"]["code"] == code, body
    assert int(response["Retry-After"]) > 0
    return body["error"]


def cancel(api_client, job: TrainingJob, **headers):
    return api_client.post(f"/v1/training_jobs/{job.public_id}/cancel", **headers)


@pytest.mark.parametrize(
    ("provider", "setting", "gpu_type"),
    [
        ("digitalocean", "VERI_DIGITALOCEAN_API_URL", "H100-80GB"),
        ("vast", "VERI_VAST_API_URL", "RTX4090-24GB"),
    ],
)
def test_cancel_with_a_rest_provider_away_is_503_then_stops_the_machine(
    request,
    settings,
    api_client,
    data,
    provider,
    setting,
    gpu_type,
):
    fake = request.getfixturevalue(provider)
    if provider == "vast":
        fake.add_offer("RTX 4090", 1, "Texas, US", 0.30)
    job = submit(api_client, data, provider, gpu_type)
    assert job.status == "provisioning", (job.error_code, job.error_message)

    setattr(settings, setting, dead_url())
    error = assert_unavailable(cancel(api_client, job))
    assert job.public_id in error["message"] and "could not be reached" in error["message"]
    # Without an Idempotency-Key the cancel itself stands; the machine is still the provider's.
    job.refresh_from_db()
    assert (job.status, job.settled_at) == ("cancelled", None)

    setattr(settings, setting, fake.url)
    response = cancel(api_client, job)
    assert (response.status_code, response.json()["status"]) == (200, "cancelled")
    assert (fake.droplets if provider == "digitalocean" else fake.instances) == {}


def test_an_sdk_cancel_with_the_provider_away_changes_nothing_until_it_answers(
    settings,
    api_client,
    data,
    digitalocean,
):
    """The SDK sends an Idempotency-Key: a 503 is not kept, the work is rolled back, and the
    same call repeated after Retry-After does it."""
    job = submit(api_client, data, "digitalocean", "H100-80GB")
    settings.VERI_DIGITALOCEAN_API_URL = dead_url()
    assert_unavailable(cancel(api_client, job, HTTP_IDEMPOTENCY_KEY="cancel-1"))
    job.refresh_from_db()
    assert job.status == "provisioning" and len(digitalocean.droplets) == 1
    settings.VERI_DIGITALOCEAN_API_URL = digitalocean.url
    response = cancel(api_client, job, HTTP_IDEMPOTENCY_KEY="cancel-1")
    assert (response.status_code, response.json()["status"]) == (200, "cancelled")
    assert digitalocean.droplets == {}


def test_cancel_with_ec2_away_is_503(ec2, settings, api_client, sft_dataset, ec2_endpoint):
    job = submit_aws(api_client, sft_dataset)
    tasks.provision_job(job_id=job.pk)
    settings.AWS_ENDPOINT_URL = dead_url()
    AwsProvider.client.cache_clear()
    error = assert_unavailable(cancel(api_client, job))
    assert "EC2 could not be reached" in error["message"]
    settings.AWS_ENDPOINT_URL = ec2.url
    AwsProvider.client.cache_clear()
    assert cancel(api_client, job).status_code == 200
    [instance] = instances(ec2_endpoint)
    assert instance["State"]["Name"] == "terminated"


def test_cancel_with_gcp_away_is_503(gcp, settings, api_client, data):
    job = submit(api_client, data, "gcp", "H100-80GB")
    assert len(gcp.vms) == 1, (job.error_code, job.error_message)
    settings.VERI_GCP_API_URL = dead_url()
    GcpProvider.client.cache_clear()
    error = assert_unavailable(cancel(api_client, job))
    assert "GCP could not be reached" in error["message"]
    settings.VERI_GCP_API_URL = gcp.url
    GcpProvider.client.cache_clear()
    assert cancel(api_client, job).status_code == 200
    assert gcp.vms == {}


def test_the_dashboards_cancel_with_the_provider_away_is_a_503_page(
    settings,
    api_client,
    data,
    digitalocean,
    billed,
):
    job = submit(api_client, data, "digitalocean", "H100-80GB")
    browser = signed_in(member_of(billed, "owner@acme.test"))
    settings.VERI_DIGITALOCEAN_API_URL = dead_url()
    response = browser.post(f"/jobs/{job.public_id}/cancel/")
    assert response.status_code == 503 and int(response["Retry-After"]) > 0
    assert "could not be stopped" in response.content.decode()
    assert response["Content-Type"].startswith("text/html")


def test_the_catalog_answers_with_availability_unknown_when_the_provider_is_away(
    settings,
    api_client,
    digitalocean,
):
    settings.VERI_DIGITALOCEAN_API_URL = dead_url()
    response = api_client.get("/v1/gpus", {"provider": "digitalocean"})
    assert response.status_code == 200, response.json()
    rows = response.json()["data"]
    assert rows and all(row["available_regions"] is None for row in rows)
