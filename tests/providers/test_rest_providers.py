"""The DigitalOcean and Vast.ai adapters against HTTP fakes of their APIs on loopback: jobs launch
with the documented request shapes and the worker's bootstrap, refusals become the catalog's
codes, cancel terminates once, the sweeper ends machines of ended jobs, and a throttled API is
retried."""

from datetime import timedelta

import pytest
from django.utils import timezone

from providers import services as provider_services
from providers.models import Instance, LaunchAttempt
from tests.providers.conftest import assert_provisioning_error
from tests.providers.rest_fakes import FakeGcp
from tests.training.conftest import drive, upload_dataset, worker_client
from training import tasks
from training.models import TrainingJob
from training.services import provisioning
from veri.services import deployment_id
from worker.runner import registration

pytestmark = pytest.mark.django_db


@pytest.fixture
def data(api_client, billed, settings, local_store_url):
    settings.VERI_STORE = local_store_url
    return upload_dataset(api_client, [{"text": f"row {i}"} for i in range(4)])


def submit(api_client, data, provider: str, gpu_type: str, gpu_count: int = 1) -> TrainingJob:
    body = {
        "gpu_count": gpu_count,
        "base_model": "Qwen/Qwen2.5-0.5B",
        "dataset_id": data["id"],
        "method": "sft_text",
        "provider": provider,
        "gpu_type": gpu_type,
        "region": "us-east-1",
        "hyperparameters": {"max_steps": 5},
    }
    response = api_client.post("/v1/training_jobs", body, format="json")
    assert response.status_code == 201, response.json()
    job = TrainingJob.objects.get(public_id=response.json()["id"])
    tasks.provision_job(job_id=job.pk)
    job.refresh_from_db()
    return job


def test_digitalocean_launches_a_tagged_droplet_and_cancel_deletes_it_once(
    digitalocean, api_client, data
):
    job = submit(api_client, data, "digitalocean", "H100-80GB")
    [body] = digitalocean.calls("POST", "/v2/droplets")
    assert body["region"] == "nyc2" and body["size"] == "gpu-h100x1-80gb"
    assert body["image"] == "gpu-h100x1-base"
    assert f"veri-job:{job.public_id}" in body["tags"]
    assert f"veri-deployment:{deployment_id()}" in body["tags"]
    assert f"\njob={job.public_id}\n" in body["user_data"]
    assert api_client.raw_key not in body["user_data"]
    instance = Instance.objects.get(job=job)
    adapter = provider_services.get_adapter("digitalocean")
    assert adapter.states([instance.external_id])[instance.external_id].alive

    api_client.post(f"/v1/training_jobs/{job.public_id}/cancel")
    api_client.post(f"/v1/training_jobs/{job.public_id}/cancel")
    assert len(digitalocean.calls("DELETE", r"/v2/droplets/\d+")) == 1
    assert digitalocean.droplets == {}
    assert not adapter.states([instance.external_id])[instance.external_id].alive


def test_multi_gpu_shapes_launch_their_droplet_size_and_vast_offer(
    digitalocean, vast, api_client, data
):
    submit(api_client, data, "digitalocean", "H100-80GB", gpu_count=8)
    [body] = digitalocean.calls("POST", "/v2/droplets")
    assert (body["size"], body["image"]) == ("gpu-h100x8-640gb", "gpu-h100x8-base")

    vast.add_offer("RTX 4090", 1, "Texas, US", 0.30)  # one GPU: not the shape asked for
    eight = vast.add_offer("RTX 4090", 8, "Texas, US", 2.40)
    job = submit(api_client, data, "vast", "RTX4090-24GB", gpu_count=8)
    assert job.status == "provisioning", (job.error_code, job.error_message)
    [search] = vast.calls("POST", "/api/v0/bundles/")
    assert search["num_gpus"] == {"eq": 8}
    assert [p for m, p, _ in vast.requests if m == "PUT"] == [f"/api/v0/asks/{eight}/"]


@pytest.mark.parametrize(
    ("message", "code"),
    [
        ("Size is not available in this region.", "CAPACITY_UNAVAILABLE"),
        ("creating this/these droplet(s) will exceed your droplet limit", "QUOTA_EXCEEDED"),
    ],
)
def test_digitalocean_refusals_are_the_catalogs_codes(
    digitalocean, api_client, data, message, code
):
    digitalocean.refusals["nyc2"] = message
    job = submit(api_client, data, "digitalocean", "H100-80GB")
    assert (job.status, job.error_code) == ("failed", code)
    assert LaunchAttempt.objects.filter(job=job, zone="nyc2").exclude(outcome="launched").exists()


def test_a_throttled_api_is_asked_again(digitalocean, api_client, data):
    digitalocean.throttle = 2  # two 429s with Retry-After: 0, then the real answer
    job = submit(api_client, data, "digitalocean", "H100-80GB")
    assert job.status == "provisioning" and len(digitalocean.droplets) == 1


def test_digitalocean_sweeper_and_availability(digitalocean, api_client, data):
    live = submit(api_client, data, "digitalocean", "H100-80GB")
    ended = submit(api_client, data, "digitalocean", "H100-80GB")
    TrainingJob.objects.filter(pk=ended.pk).update(status="failed", error_code="worker_failed")
    swept = provisioning.sweep_orphans()
    assert swept == [Instance.objects.get(job=ended).external_id]
    assert list(digitalocean.droplets) == [int(Instance.objects.get(job=live).external_id)]
    rows = api_client.get("/v1/gpus", {"provider": "digitalocean"}).json()["data"]
    assert rows[0]["available_regions"] == ["us-east-1"]  # nyc2 offers the size; ams3 does not


def test_vast_takes_the_cheapest_offer_in_the_zone_and_the_next_when_it_is_gone(
    vast, api_client, data
):
    vast.add_offer("RTX 4090", 1, "Bavaria, DE", 0.20)  # cheaper, but not in the US
    taken = vast.add_offer("RTX 4090", 1, "Texas, US", 0.30)
    second = vast.add_offer("RTX 4090", 1, "Quebec, CA", 0.35)
    vast.gone_on_accept.add(taken)  # someone else accepts it between our search and accept
    job = submit(api_client, data, "vast", "RTX4090-24GB")
    assert job.status == "provisioning", (job.error_code, job.error_message)
    [search] = vast.calls("POST", "/api/v0/bundles/")
    assert search["gpu_name"] == {"eq": "RTX 4090"} and search["num_gpus"] == {"eq": 1}
    accepts = [p for m, p, _ in vast.requests if m == "PUT"]
    assert accepts == [f"/api/v0/asks/{taken}/", f"/api/v0/asks/{second}/"]
    [instance] = vast.instances.values()
    assert instance["label"].startswith(f"veri:{deployment_id()}:{job.public_id}:")
    assert f"\njob={job.public_id}\n" in instance["onstart"]
    api_client.post(f"/v1/training_jobs/{job.public_id}/cancel")
    assert vast.instances == {}
    assert len(vast.calls("DELETE", r"/api/v0/instances/\d+/")) == 1


def test_vast_out_of_credit_is_provider_out_of_funds_and_no_offer_is_no_capacity(
    vast, api_client, data
):
    job = submit(api_client, data, "vast", "RTX4090-24GB")
    assert (job.status, job.error_code) == ("failed", "CAPACITY_UNAVAILABLE")
    vast.add_offer("RTX 4090", 1, "Oregon, US", 0.3)
    vast.credit_left = False
    job = submit(api_client, data, "vast", "RTX4090-24GB")
    assert (job.status, job.error_code) == ("failed", "PROVIDER_OUT_OF_FUNDS")
    assert "or use:" in job.error_message or "Retry" in job.error_message


def test_vast_sweeper_ends_instances_labelled_for_ended_jobs(vast, api_client, data):
    vast.add_offer("RTX 4090", 1, "Oregon, US", 0.3)
    vast.add_offer("RTX 4090", 1, "Ohio, US", 0.3)
    live = submit(api_client, data, "vast", "RTX4090-24GB")
    ended = submit(api_client, data, "vast", "RTX4090-24GB")
    TrainingJob.objects.filter(pk=ended.pk).update(status="completed")
    foreign = vast.new_id()
    vast.instances[foreign] = {"id": foreign, "actual_status": "running", "label": "my own box"}
    assert provisioning.sweep_orphans() == [Instance.objects.get(job=ended).external_id]
    assert set(vast.instances) == {int(Instance.objects.get(job=live).external_id), foreign}


def obtained(fake, job: TrainingJob) -> TrainingJob:
    """GCP found the GPU: the VM runs, and the next watchdog tick sees it."""
    for vm in fake.vms.values():
        vm["status"] = "RUNNING"
    tasks.check_jobs(now=timezone.now())
    job.refresh_from_db()
    return job


def test_gcp_flex_start_waits_in_queued_unbilled_until_gcp_has_the_gpu(gcp, api_client, data):
    job = submit(api_client, data, "gcp", "H100-80GB")
    assert job.status == "queued" and len(gcp.vms) == 1, (job.error_code, job.error_message)
    tasks.check_jobs(now=timezone.now())  # GCP still looks: nothing changes, nothing accrues
    job.refresh_from_db()
    assert job.status == "queued" and Instance.objects.get(job=job).launched_at is None
    assert obtained(gcp, job).status == "provisioning"
    assert Instance.objects.get(job=job).launched_at is not None  # billing starts here
    # GCP gives up on another request: the job fails, unbilled.
    other = submit(api_client, data, "gcp", "H100-80GB")
    api_client.post(f"/v1/training_jobs/{job.public_id}/cancel")
    tasks.provision_job(job_id=other.pk)
    gcp.vms.clear()
    tasks.check_jobs(now=timezone.now())
    other.refresh_from_db()
    assert (other.status, other.error_code) == ("failed", "CAPACITY_UNAVAILABLE")


def test_gcp_launches_a_flex_start_vm_one_gpu_at_a_time(gcp, api_client, data):
    first = submit(api_client, data, "gcp", "H100-80GB")
    assert obtained(gcp, first).status == "provisioning", (first.error_code, first.error_message)
    [body] = gcp.calls("POST", r"/compute/v1/projects/veri-test/zones/[^/]+/instances")
    assert body["machineType"] == "zones/us-east4-a/machineTypes/a3-highgpu-1g"
    scheduling = body["scheduling"]
    assert scheduling["provisioningModel"] == "FLEX_START"
    assert scheduling["instanceTerminationAction"] == "DELETE"
    assert int(scheduling["maxRunDuration"]["seconds"]) == 24 * 3600
    assert body["labels"] == {"veri-job": first.public_id, "veri-deployment": deployment_id()}
    [startup] = body["metadata"]["items"]
    assert startup["key"] == "startup-script"
    assert f"\njob={first.public_id}\n" in startup["value"]

    # A second job waits in `queued` while the first holds the deployment's one GCP GPU.
    second = submit(api_client, data, "gcp", "H100-80GB")
    assert second.status == "queued" and len(gcp.vms) == 1
    api_client.post(f"/v1/training_jobs/{first.public_id}/cancel")
    assert gcp.vms == {}
    tasks.provision_job(job_id=second.pk)
    assert obtained(gcp, second).status == "provisioning" and len(gcp.vms) == 1


def test_gcp_stockout_moves_to_the_next_zone_and_quota_fails_the_job(gcp, api_client, data):
    gcp.stockouts.add("us-east4-a")
    job = submit(api_client, data, "gcp", "H100-80GB")
    assert [z for z, _ in gcp.vms] == ["us-east4-c"], (job.error_code, job.error_message)
    api_client.post(f"/v1/training_jobs/{job.public_id}/cancel")
    gcp.quota_exceeded = True
    job = submit(api_client, data, "gcp", "H100-80GB")
    assert (job.status, job.error_code) == ("failed", "QUOTA_EXCEEDED")


@pytest.mark.parametrize(
    ("hours_ran", "code", "fault"),
    [(2, "provider_reclaimed", "platform"), (24, "max_run_duration_reached", "customer")],
)
def test_a_vm_gcp_took_back_is_reclaimed_or_at_its_24_hours(
    gcp, api_client, data, hours_ran, code, fault
):
    job = obtained(gcp, submit(api_client, data, "gcp", "H100-80GB"))
    TrainingJob.objects.filter(pk=job.pk).update(auto_resume=False)  # the code alone, here
    drive(job, "configuring", "running")
    Instance.objects.filter(job=job).update(launched_at=timezone.now() - timedelta(hours=hours_ran))
    gcp.vms.clear()  # GCP deleted the VM
    tasks.check_jobs(now=timezone.now())
    job.refresh_from_db()
    assert (job.status, job.error_code, job.error_attribution) == ("failed", code, fault)


def test_gcp_sweeper_deletes_vms_of_ended_jobs(gcp, api_client, data):
    job = submit(api_client, data, "gcp", "H100-80GB")
    TrainingJob.objects.filter(pk=job.pk).update(status="failed", error_code="worker_failed")
    assert provisioning.sweep_orphans() == [Instance.objects.get(job=job).external_id]
    assert gcp.vms == {}


def test_a_worker_registering_before_the_watchdog_saw_the_gpu_moves_the_job_on(
    gcp, api_client, data
):
    job = submit(api_client, data, "gcp", "H100-80GB")
    assert job.status == "queued"
    answer = worker_client(job).post(
        f"/v1/worker/jobs/{job.public_id}/register",
        registration() | {"hostname": "vm"},
        format="json",
    )
    assert answer.status_code == 200, answer.json()
    job.refresh_from_db()
    assert job.status == "configuring"
    assert Instance.objects.get(job=job).launched_at is not None


def test_gpus_for_gcp_are_the_regions_whose_zones_offer_them(gcp, api_client):
    rows = api_client.get("/v1/gpus", {"provider": "gcp"}).json()["data"]
    by_gpu = {r["gpu_type"]: r["available_regions"] for r in rows}
    assert by_gpu == {"H100-80GB": ["us-east-1"], "A100-80GB": ["us-west-2"]}


def test_a_digitalocean_token_refused_is_the_platforms_provisioning_error(
    digitalocean, api_client, data, settings
):
    settings.DIGITALOCEAN_TOKEN = "revoked-token"
    job = submit(api_client, data, "digitalocean", "H100-80GB")
    assert_provisioning_error(api_client, job, "HTTP 401", "Unable to authenticate you")
    assert len(digitalocean.calls("POST", "/v2/droplets")) == 1  # not once per zone


def test_a_digitalocean_image_refused_is_provisioning_error_not_capacity(
    digitalocean, api_client, data
):
    digitalocean.refusals["nyc2"] = (
        422,
        "unprocessable_entity",
        "You specified an invalid image for Droplet creation.",
    )
    job = submit(api_client, data, "digitalocean", "H100-80GB")
    assert_provisioning_error(api_client, job, "invalid image for Droplet creation")


def test_a_vast_key_refused_is_the_platforms_provisioning_error(vast, api_client, data, settings):
    vast.add_offer("RTX 4090", 1, "Oregon, US", 0.3)
    settings.VAST_API_KEY = "revoked-key"
    job = submit(api_client, data, "vast", "RTX4090-24GB")
    assert_provisioning_error(api_client, job, "HTTP 401", "Invalid or missing API key")


def test_a_vast_rental_refused_for_its_parameters_is_not_a_missing_offer(vast, api_client, data):
    """Only an offer taken meanwhile (`no_such_ask`) moves on to the next offer; Vast refusing
    the rental's own parameters would refuse every offer the same way."""
    for region in ("Oregon, US", "Ohio, US"):
        vast.add_offer("RTX 4090", 1, region, 0.3)
    vast.refuse_accept = (
        400,
        {"success": False, "error": "invalid_args", "msg": "disk: must be a positive number."},
    )
    job = submit(api_client, data, "vast", "RTX4090-24GB")
    assert_provisioning_error(api_client, job, "invalid_args disk: must be a positive number.")
    assert len([m for m, _, _ in vast.requests if m == "PUT"]) == 1


@pytest.mark.parametrize(
    ("status", "reason", "message"),
    [
        (
            403,
            "forbidden",
            "Required 'compute.instances.create' permission for "
            "'projects/veri-test/zones/us-east4-a/instances/veri-job'",
        ),
        (
            404,
            "notFound",
            "The resource 'projects/debian-cloud/global/images/family/no-such-image' was not found",
        ),
    ],
)
def test_gcp_refusals_that_are_not_quota_or_stockout_are_provisioning_error(
    gcp, api_client, data, status, reason, message
):
    """A 403 is a quota only when it names one; a permission refused is configuration."""
    gcp.refuse_insert = FakeGcp.error(status, reason, message)
    job = submit(api_client, data, "gcp", "H100-80GB")
    assert_provisioning_error(api_client, job, message)
    assert gcp.vms == {}
