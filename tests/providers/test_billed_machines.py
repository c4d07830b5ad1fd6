"""No billed machine left behind, no create that rents twice: the sweeper deletes a machine of
an ended job in every state its provider still bills, a powered-off machine is not alive for the
watchdog, a create whose answer was lost adopts the machine it made, GCP's Flex-start wait keeps
the job queued, and an ended job's machine asks the control plane to delete it."""

# ruff: noqa: F811 - the fixtures of test_rest_providers, imported by name

import httpx
import pytest
from django.utils import timezone

from providers import gcp as gcp_module
from providers import services as provider_services
from providers.base import split_scoped_id
from providers.models import Instance
from tests.providers.rest_fakes import FakeGcp, FakeVast
from tests.providers.test_rest_providers import data, submit  # noqa: F401 - a fixture
from tests.training.conftest import worker_client
from training import tasks
from training.models import TrainingJob
from training.services import provisioning
from training.services.worker import mint_job_token

pytestmark = pytest.mark.django_db


def end(job: TrainingJob) -> None:
    TrainingJob.objects.filter(pk=job.pk).update(status="failed", error_code="worker_failed")


def external(job: TrainingJob) -> str:
    return Instance.objects.get(job=job).external_id


# --- DigitalOcean -------------------------------------------------------------------------------


@pytest.mark.parametrize("status", ["new", "active", "off", "archive"])
def test_a_droplet_of_an_ended_job_is_deleted_in_every_status(
    digitalocean, api_client, data, status
):
    job = submit(api_client, data, "digitalocean", "H100-80GB")
    digitalocean.set_status(int(external(job)), status)
    end(job)
    assert provisioning.sweep_orphans() == [external(job)]
    assert digitalocean.droplets == {}


def test_a_powered_off_droplet_is_not_alive_and_only_gpu_droplets_are_listed(
    digitalocean, api_client, data
):
    job = submit(api_client, data, "digitalocean", "H100-80GB")
    adapter = provider_services.get_adapter("digitalocean")
    droplet = external(job)
    assert adapter.states([droplet])[droplet].alive
    digitalocean.set_status(int(droplet), "off")  # the bootstrap's own `shutdown -h`
    assert not adapter.states([droplet])[droplet].alive
    # DigitalOcean lists GPU droplets only with type=gpus, never together with tag_name.
    listings = [q for m, p, q in digitalocean.requests if m == "GET" and p == "/v2/droplets"]
    assert listings  # the body is None for a GET; the fake records the refusals in `bad`
    assert digitalocean.bad == []


@pytest.mark.parametrize("how", ["drop", 502])
def test_a_droplet_create_whose_answer_is_lost_rents_one_droplet(
    digitalocean, api_client, data, how
):
    digitalocean.lost.lose(how)
    job = submit(api_client, data, "digitalocean", "H100-80GB")
    assert job.status == "provisioning", (job.error_code, job.error_message)
    [droplet] = digitalocean.droplets
    assert external(job) == str(droplet)
    assert len(digitalocean.calls("POST", "/v2/droplets")) == 1


# --- Vast.ai ------------------------------------------------------------------------------------


@pytest.mark.parametrize("status", FakeVast.STATUSES)
def test_a_vast_instance_of_an_ended_job_is_destroyed_in_every_status(
    vast, api_client, data, status
):
    vast.add_offer("RTX 4090", 1, "Oregon, US", 0.3)
    job = submit(api_client, data, "vast", "RTX4090-24GB")
    vast.set_status(int(external(job)), status)
    end(job)
    assert provisioning.sweep_orphans() == [external(job)]
    assert vast.instances == {}


def test_a_destroyed_vast_instance_is_left_to_vast(vast, api_client, data):
    vast.add_offer("RTX 4090", 1, "Oregon, US", 0.3)
    job = submit(api_client, data, "vast", "RTX4090-24GB")
    vast.set_status(int(external(job)), FakeVast.DESTROYED)  # no longer billed
    end(job)
    assert provisioning.sweep_orphans() == []
    assert [m for m, _, _ in vast.requests if m == "DELETE"] == []


@pytest.mark.parametrize("how", ["drop", 502])
def test_a_vast_accept_whose_answer_is_lost_rents_one_instance(vast, api_client, data, how):
    vast.add_offer("RTX 4090", 1, "Oregon, US", 0.3)
    vast.add_offer("RTX 4090", 1, "Ohio, US", 0.35)
    vast.lost.lose(how)
    job = submit(api_client, data, "vast", "RTX4090-24GB")
    assert job.status == "provisioning", (job.error_code, job.error_message)
    [instance] = vast.instances
    assert external(job) == str(instance)
    assert len([m for m, _, _ in vast.requests if m == "PUT"]) == 1


def test_vast_offers_are_searched_with_room_for_the_disk(vast, api_client, data, settings):
    small = vast.add_offer(
        "RTX 4090", 1, "Oregon, US", 0.2, disk_space=settings.VERI_VAST_DISK_GB - 1
    )
    roomy = vast.add_offer("RTX 4090", 1, "Ohio, US", 0.3)
    job = submit(api_client, data, "vast", "RTX4090-24GB")
    assert job.status == "provisioning", (job.error_code, job.error_message)
    [search] = vast.calls("POST", "/api/v0/bundles/")
    assert search["disk_space"] == {"gte": settings.VERI_VAST_DISK_GB}
    assert [p for m, p, _ in vast.requests if m == "PUT"] == [f"/api/v0/asks/{roomy}/"]
    assert small not in vast.taken


# --- GCP ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("status", FakeGcp.STATUSES)
def test_a_gcp_vm_of_an_ended_job_is_deleted_in_every_status(gcp, api_client, data, status):
    job = submit(api_client, data, "gcp", "H100-80GB")
    zone, name = split_scoped_id(external(job))
    gcp.set_status(zone, name, status)
    end(job)
    assert provisioning.sweep_orphans() == [external(job)]
    assert gcp.vms == {}


@pytest.mark.parametrize("how", ["drop", 502])
def test_a_gcp_insert_whose_answer_is_lost_rents_one_vm(gcp, api_client, data, how):
    gcp.lost.lose(how)
    job = submit(api_client, data, "gcp", "H100-80GB")
    assert job.status == "queued", (job.error_code, job.error_message)
    [(zone, name)] = gcp.vms
    assert external(job) == f"{zone}/{name}"
    inserts = [q for q in gcp.calls("POST", r"/compute/v1/projects/veri-test/zones/.*/instances")]
    assert len(inserts) == 2  # sent again, with the same request id, answered by the first


def test_a_flex_start_insert_still_waiting_keeps_the_job_queued(gcp, api_client, data, monkeypatch):
    monkeypatch.setattr(gcp_module, "INSERT_WAIT_SECONDS", 1)
    gcp.waiting.add("us-east4-a")  # Flex-start holds the insert operation open
    job = submit(api_client, data, "gcp", "H100-80GB")
    assert job.status == "queued", (job.error_code, job.error_message)
    assert list(gcp.vms) == [("us-east4-a", f"veri-{job.public_id.replace('_', '-')}")]
    tasks.check_jobs(now=timezone.now())
    job.refresh_from_db()
    assert job.status == "queued"
    for vm in gcp.vms.values():
        vm["status"] = "RUNNING"  # GCP found the GPU
    tasks.check_jobs(now=timezone.now())
    job.refresh_from_db()
    assert job.status == "provisioning"


def test_the_flex_start_request_is_what_gcp_documents(gcp, api_client, data):
    submit(api_client, data, "gcp", "H100-80GB")
    [body] = gcp.calls("POST", r"/compute/v1/projects/veri-test/zones/[^/]+/instances")
    assert body["reservationAffinity"] == {"consumeReservationType": "NO_RESERVATION"}
    assert body["scheduling"]["onHostMaintenance"] == "TERMINATE"
    assert body["networkInterfaces"][0]["nicType"] == "GVNIC"  # an A3 machine type


BASE_INSERT = {
    "name": "veri-x",
    "machineType": "zones/us-east4-a/machineTypes/a3-highgpu-1g",
    "disks": [{"boot": True}],
    "networkInterfaces": [{"network": "global/networks/default", "nicType": "GVNIC"}],
    "reservationAffinity": {"consumeReservationType": "NO_RESERVATION"},
    "scheduling": {
        "provisioningModel": "FLEX_START",
        "instanceTerminationAction": "DELETE",
        "maxRunDuration": {"seconds": "86400"},
        "onHostMaintenance": "TERMINATE",
    },
}


@pytest.mark.parametrize(
    ("change", "refusal"),
    [
        ({}, None),
        ({"reservationAffinity": {"consumeReservationType": "ANY_RESERVATION"}}, "NO_RESERVATION"),
        (
            {"scheduling": {**BASE_INSERT["scheduling"], "maxRunDuration": {"seconds": "700000"}}},
            "seven days",
        ),
        (
            {"scheduling": {**BASE_INSERT["scheduling"], "onHostMaintenance": "MIGRATE"}},
            "TERMINATE",
        ),
        ({"networkInterfaces": [{"network": "global/networks/default"}]}, "GVNIC"),
    ],
)
def test_the_gcp_fake_refuses_what_gcp_refuses(change, refusal):
    fake = FakeGcp()
    try:
        answer = httpx.post(
            f"{fake.url}/compute/v1/projects/p/zones/us-east4-a/instances",
            json={**BASE_INSERT, **change},
        )
    finally:
        fake.close()
    if refusal is None:
        assert answer.status_code == 200, answer.text
    else:
        assert answer.status_code == 400 and refusal in answer.text, answer.text


# --- The machine's last act: release ------------------------------------------------------------


def test_an_ended_jobs_machine_asks_to_be_deleted_with_its_token(digitalocean, api_client, data):
    job = submit(api_client, data, "digitalocean", "H100-80GB")
    worker = worker_client(job)
    release = f"/v1/worker/jobs/{job.public_id}/release"
    answer = worker.post(release)
    assert (answer.status_code, answer.json()["error"]["code"]) == (409, "job_not_ended")
    assert len(digitalocean.droplets) == 1  # a running job keeps its machine

    other = submit(api_client, data, "digitalocean", "H100-80GB")
    assert worker_client(other).post(release).status_code == 404  # another job's token

    end(job)
    assert worker.post(release).status_code == 200  # the token still opens release
    assert int(external(other)) in digitalocean.droplets
    assert int(external(job)) not in digitalocean.droplets
    assert Instance.objects.get(job=job).terminated_at is not None
    assert worker.post(release).status_code == 200  # again: nothing left to delete, fine
    # Any other worker call with the ended job's token is refused.
    assert worker.post(f"/v1/worker/jobs/{job.public_id}/heartbeat", {}).status_code == 401


def test_a_relaunched_jobs_earlier_token_cannot_release(digitalocean, api_client, data):
    job = submit(api_client, data, "digitalocean", "H100-80GB")
    earlier = worker_client(job)
    mint_job_token(job=job)  # a relaunch replaces every token of the job
    end(job)
    assert earlier.post(f"/v1/worker/jobs/{job.public_id}/release").status_code == 401
    assert len(digitalocean.droplets) == 1
