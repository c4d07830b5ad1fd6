import boto3
import httpx
import pytest

from billing.models import LedgerEntry, Refund
from providers import services as provider_services
from providers.aws import AwsProvider
from providers.gcp import GcpProvider
from tests.conftest import moto_server
from tests.providers.ec2_proxy import Ec2Proxy
from tests.providers.rest_fakes import TOKEN, FakeDigitalOcean, FakeGcp, FakeVast
from training import tasks
from training.models import TrainingJob


def assert_provisioning_error(api_client, job: TrainingJob, *words: str) -> dict:
    """The launch ended as the platform's `provisioning_error`, in the provider's own words (each
    of `words` in the message), never as "no capacity"; nothing booted, so nothing is charged
    and there is nothing to refund."""
    tasks.settle_job(job_id=job.pk)
    body = api_client.get(f"/v1/training_jobs/{job.public_id}").json()
    assert body["status"] == "failed", body
    error = body["error"]
    assert (error["code"], error["attribution"]) == ("provisioning_error", "platform"), error
    for word in words:
        assert word in error["message"], error["message"]
    assert "capacity" not in error["message"].lower(), error["message"]
    assert body["cost_usd"] == "0.00" and body["refund"] is None, body
    assert not LedgerEntry.objects.filter(job=job).exists()
    assert not Refund.objects.filter(job=job).exists()
    return error


ZONES = ["us-east-1a", "us-east-1b", "us-east-1c"]


@pytest.fixture(scope="session")
def ec2_endpoint():
    """EC2 on a moto server of its own: each test resets it, which on the shared S3 server would
    also wipe the buckets of tests running beside these on another xdist worker. One for each
    test process (its tests run one at a time), not one per module: each start is 3 s of CPU."""
    with moto_server() as url:
        yield url


@pytest.fixture
def ec2(ec2_endpoint, settings):
    """EC2 (moto, reset) behind the refusing proxy; the `aws` provider offered and usable."""
    httpx.post(f"{ec2_endpoint}/moto-api/reset")
    proxy = Ec2Proxy(ec2_endpoint)
    settings.AWS_ENDPOINT_URL = proxy.url
    settings.VERI_AWS_AMI_ID = "ami-0123456789abcdef0"
    settings.VERI_PROVIDER_ADAPTERS = {
        "local": "providers.local.LocalProvider",
        "aws": "providers.aws.AwsProvider",
    }
    AwsProvider.client.cache_clear()
    provider_services._adapter.cache_clear()
    provider_services._availability.clear()
    yield proxy
    proxy.close()
    AwsProvider.client.cache_clear()
    provider_services._adapter.cache_clear()


def ec2_client(endpoint: str):
    return boto3.client("ec2", endpoint_url=endpoint, region_name="us-east-1")


def instances(endpoint: str) -> list[dict]:
    answer = ec2_client(endpoint).describe_instances()
    return [i for r in answer["Reservations"] for i in r["Instances"]]


def submit_aws(api_client, dataset, **fields) -> TrainingJob:
    body = {
        "base_model": "Qwen/Qwen2.5-0.5B",
        "dataset_id": dataset["id"],
        "method": "sft_text",
        "provider": "aws",
        "gpu_type": "L4-24GB",
        "region": "us-east-1",
        "hyperparameters": {"max_steps": 5},
    } | fields
    response = api_client.post("/v1/training_jobs", body, format="json")
    assert response.status_code == 201, response.json()
    return TrainingJob.objects.get(public_id=response.json()["id"])


def offer(settings, name: str, path: str) -> None:
    settings.VERI_PROVIDER_ADAPTERS = {**settings.VERI_PROVIDER_ADAPTERS, name: path}
    provider_services._adapter.cache_clear()
    provider_services._availability.clear()


@pytest.fixture
def digitalocean(settings):
    fake = FakeDigitalOcean()
    settings.DIGITALOCEAN_TOKEN = TOKEN
    settings.VERI_DIGITALOCEAN_API_URL = fake.url
    offer(settings, "digitalocean", "providers.digitalocean.DigitalOceanProvider")
    yield fake
    fake.close()
    assert fake.bad == []  # every request had the documented shape


@pytest.fixture
def vast(settings):
    fake = FakeVast()
    settings.VAST_API_KEY = TOKEN
    settings.VERI_VAST_API_URL = fake.url
    offer(settings, "vast", "providers.vast.VastProvider")
    yield fake
    fake.close()
    assert fake.bad == []


@pytest.fixture
def gcp(settings):
    fake = FakeGcp()
    settings.VERI_GCP_PROJECT = "veri-test"
    settings.VERI_GCP_API_URL = fake.url
    settings.GOOGLE_APPLICATION_CREDENTIALS = None
    GcpProvider.client.cache_clear()
    offer(settings, "gcp", "providers.gcp.GcpProvider")
    yield fake
    fake.close()
    GcpProvider.client.cache_clear()
    assert fake.bad == []
