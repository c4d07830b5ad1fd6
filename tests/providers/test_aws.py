"""The AWS adapter against moto's EC2 in server mode (a moto server of this module's own),
behind a proxy that refuses chosen launches with EC2's own error codes: jobs launch tagged
instances with the worker's bootstrap, move to the next zone when one has no capacity, fail with
the catalog's codes, terminate exactly once, and the sweeper ends machines no live job owns in
every state EC2 still bills."""

import base64
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from providers import services as provider_services
from providers.aws import DEPLOYMENT_TAG, JOB_TAG
from providers.models import Instance, LaunchAttempt
from tests.e2e.conftest import qcluster  # noqa: F401 - the real task cluster
from tests.providers.conftest import (
    ZONES,
    assert_provisioning_error,
    ec2_client,
    instances,
    submit_aws,
)
from tests.training.conftest import upload_dataset
from training import tasks
from training.models import TrainingJob
from training.services import provisioning
from veri.services import deployment_id

pytestmark = pytest.mark.django_db


@pytest.fixture
def sft_dataset(api_client, billed, settings, local_store_url):
    settings.VERI_STORE = local_store_url
    return upload_dataset(api_client, [{"text": f"row {i}"} for i in range(4)])


def test_a_job_launches_a_tagged_instance_with_the_bootstrap_and_cancel_terminates_it_once(
    ec2, api_client, sft_dataset, ec2_endpoint
):
    job = submit_aws(api_client, sft_dataset)
    assert tasks.provision_job(job_id=job.pk) != "not claimed"
    [instance] = instances(ec2_endpoint)
    tags = {t["Key"]: t["Value"] for t in instance["Tags"]}
    assert tags[JOB_TAG] == job.public_id and tags[DEPLOYMENT_TAG] == deployment_id()
    assert instance["InstanceType"] == "g6.xlarge"
    assert instance["Placement"]["AvailabilityZone"] == ZONES[0]
    user_data = ec2_client(ec2_endpoint).describe_instance_attribute(
        InstanceId=instance["InstanceId"], Attribute="userData"
    )["UserData"]["Value"]
    script = base64.b64decode(user_data).decode()
    assert f"\njob={job.public_id}\n" in script and "\napi=http://" in script
    assert "VERI_JOB_TOKEN=" in script and api_client.raw_key not in script
    recorded = Instance.objects.get(job=job)
    assert recorded.external_id == f"us-east-1/{instance['InstanceId']}"
    assert (
        provider_services.get_adapter("aws")
        .states([recorded.external_id])[recorded.external_id]
        .alive
    )

    assert api_client.post(f"/v1/training_jobs/{job.public_id}/cancel").status_code == 200
    api_client.post(f"/v1/training_jobs/{job.public_id}/cancel")  # twice: still one terminate
    [after] = instances(ec2_endpoint)
    assert after["State"]["Name"] == "terminated"
    assert [c["InstanceId.1"] for c in ec2.calls("TerminateInstances")] == [instance["InstanceId"]]
    assert (
        not provider_services.get_adapter("aws")
        .states([recorded.external_id])[recorded.external_id]
        .alive
    )


@pytest.mark.parametrize(
    ("gpu_type", "gpu_count", "expected"),
    [
        ("L4-24GB", 4, "g6.12xlarge"),
        ("A10G-24GB", 8, "g5.48xlarge"),
        ("H100-80GB", 8, "p5.48xlarge"),
    ],
)
def test_multi_gpu_shapes_launch_their_instance_types(
    ec2, api_client, sft_dataset, ec2_endpoint, gpu_type, gpu_count, expected
):
    job = submit_aws(api_client, sft_dataset, gpu_type=gpu_type, gpu_count=gpu_count)
    assert tasks.provision_job(job_id=job.pk) == "launched"
    [instance] = instances(ec2_endpoint)
    assert instance["InstanceType"] == expected
    assert Instance.objects.get(job=job).gpu_count == gpu_count


def test_a_zone_without_capacity_moves_the_launch_to_the_next_zone(
    ec2, api_client, sft_dataset, ec2_endpoint
):
    ec2.refusals[ZONES[0]] = "InsufficientInstanceCapacity"
    job = submit_aws(api_client, sft_dataset)
    tasks.provision_job(job_id=job.pk)
    [instance] = instances(ec2_endpoint)
    assert instance["Placement"]["AvailabilityZone"] == ZONES[1]
    outcomes = list(
        LaunchAttempt.objects.filter(job=job).order_by("pk").values_list("zone", "outcome")
    )
    assert outcomes == [(ZONES[0], "capacity"), (ZONES[1], "launched")]


@pytest.mark.parametrize(
    ("refusal", "code"),
    [
        ("InsufficientInstanceCapacity", "CAPACITY_UNAVAILABLE"),
        ("VcpuLimitExceeded", "QUOTA_EXCEEDED"),
    ],
)
def test_refusals_in_every_zone_fail_with_the_catalogs_code_and_bill_nothing(
    ec2, api_client, sft_dataset, ec2_endpoint, refusal, code
):
    for zone in ZONES:
        ec2.refusals[zone] = refusal
    job = submit_aws(api_client, sft_dataset, max_launch_attempts=3)
    tasks.provision_job(job_id=job.pk)
    job.refresh_from_db()
    assert (job.status, job.error_code) == ("failed", code)
    assert instances(ec2_endpoint) == []
    tasks.settle_job(job_id=job.pk)
    job.refresh_from_db()
    assert job.billing.cost_micros == 0
    body = api_client.get(f"/v1/training_jobs/{job.public_id}").json()
    assert body["error"]["code"] == code
    if code == "QUOTA_EXCEEDED":
        assert "or use:" in body["error"]["message"]


def launch_tagged(endpoint: str, job_id: str, deployment: str) -> str:
    """An instance tagged as Veri tags one, launched straight on moto (not by Veri)."""
    tags = [{"Key": JOB_TAG, "Value": job_id}, {"Key": DEPLOYMENT_TAG, "Value": deployment}]
    answer = ec2_client(endpoint).run_instances(
        ImageId="ami-0123456789abcdef0",
        InstanceType="g6.xlarge",
        MinCount=1,
        MaxCount=1,
        TagSpecifications=[{"ResourceType": "instance", "Tags": tags}],
    )
    return answer["Instances"][0]["InstanceId"]


def test_the_sweeper_ends_machines_no_live_job_owns_and_leaves_the_rest(
    ec2, api_client, sft_dataset, ec2_endpoint
):
    live = submit_aws(api_client, sft_dataset)
    tasks.provision_job(job_id=live.pk)
    ended = submit_aws(api_client, sft_dataset)
    tasks.provision_job(job_id=ended.pk)
    # The job ended, but its machine was left running (a terminate that never reached EC2).
    TrainingJob.objects.filter(pk=ended.pk).update(status="failed", error_code="worker_failed")
    unknown = launch_tagged(ec2_endpoint, "job_neverexisted", deployment_id())
    # a second machine for a live job
    duplicate = launch_tagged(ec2_endpoint, live.public_id, deployment_id())
    someone_elses = launch_tagged(ec2_endpoint, "job_theirs", "another-deployment")
    swept = provisioning.sweep_orphans()
    ended_id = Instance.objects.get(job=ended).external_id
    assert sorted(swept) == sorted([ended_id, f"us-east-1/{unknown}", f"us-east-1/{duplicate}"])
    states = {i["InstanceId"]: i["State"]["Name"] for i in instances(ec2_endpoint)}
    live_id = Instance.objects.get(job=live).external_id.split("/")[1]
    assert states[live_id] == "running" and states[someone_elses] == "running"
    assert Instance.objects.get(job=ended).terminated_at is not None
    assert provisioning.sweep_orphans() == []  # nothing left to sweep


@pytest.mark.parametrize(
    ("state", "bills", "alive"),
    [
        ("pending", True, True),
        ("running", True, True),
        ("stopping", True, False),
        ("stopped", True, False),
        ("shutting-down", False, False),
        ("terminated", False, False),
    ],
)
def test_an_instance_of_an_ended_or_unknown_job_is_terminated_in_every_state_ec2_bills(
    ec2, api_client, sft_dataset, ec2_endpoint, state, bills, alive
):
    """A stopped or stopping instance still pays for its EBS volumes
    (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/ec2-instance-lifecycle.html, "Instance
    states"): the sweeper terminates it like a running one. Shutting-down and terminated ones
    bill no more and are ending on their own: left alone. Only pending and running instances run
    a worker (alive for the watchdog)."""
    job = submit_aws(api_client, sft_dataset)
    assert tasks.provision_job(job_id=job.pk) == "launched"
    ended = Instance.objects.get(job=job).external_id
    unknown = launch_tagged(ec2_endpoint, "job_neverexisted", deployment_id())
    ids = [ended.split("/")[1], unknown]
    moto = ec2_client(ec2_endpoint)  # straight to moto: the proxy records only Veri's calls
    if state == "stopped":
        moto.stop_instances(InstanceIds=ids)
    elif state == "terminated":
        moto.terminate_instances(InstanceIds=ids)
    elif state != "running":
        ec2.states |= dict.fromkeys(ids, state)  # moto skips EC2's transitional states
    TrainingJob.objects.filter(pk=job.pk).update(status="failed", error_code="worker_failed")
    adapter = provider_services.get_adapter("aws")
    assert adapter.states([ended])[ended].alive is alive

    swept = provisioning.sweep_orphans()
    terminated = sorted(c["InstanceId.1"] for c in ec2.calls("TerminateInstances"))
    if bills:
        assert sorted(swept) == sorted([ended, f"us-east-1/{unknown}"])
        assert terminated == sorted(ids)
        states = {i["InstanceId"]: i["State"]["Name"] for i in instances(ec2_endpoint)}
        assert [states[i] for i in ids] == ["terminated", "terminated"]
        assert Instance.objects.get(job=job).terminated_at is not None
    else:
        assert (swept, terminated) == ([], [])
    assert provisioning.sweep_orphans() == []  # nothing left that bills


def test_gpus_for_aws_say_where_each_gpu_can_launch_now(ec2, api_client):
    rows = api_client.get("/v1/gpus", {"provider": "aws"}).json()["data"]
    by_gpu = {r["gpu_type"]: r for r in rows}
    assert by_gpu["L4-24GB"]["usable"] is True
    assert "us-east-1" in by_gpu["L4-24GB"]["available_regions"]
    assert len(ec2.calls("DescribeInstanceTypeOfferings")) > 0
    asked = len(ec2.calls("DescribeInstanceTypeOfferings"))
    api_client.get("/v1/gpus", {"provider": "aws"})
    assert len(ec2.calls("DescribeInstanceTypeOfferings")) == asked  # cached for a minute


def test_veri_providers_names_what_a_deployment_offers(tmp_path):
    env = {**os.environ, "VERI_PROVIDERS": "local,aws"}
    code = "from django.conf import settings; print(sorted(settings.VERI_PROVIDER_ADAPTERS))"
    out = subprocess.run(
        [sys.executable, "-c", f"import django; django.setup(); {code}"],
        env={**env, "DJANGO_SETTINGS_MODULE": "config.settings"},
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert out.stdout.strip() == "['aws', 'local']", out.stderr
    bad = subprocess.run(
        [sys.executable, "-c", "import django; django.setup()"],
        env={**env, "VERI_PROVIDERS": "local,azure", "DJANGO_SETTINGS_MODULE": "config.settings"},
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert bad.returncode != 0 and "unknown providers ['azure']" in bad.stderr


@pytest.mark.slow
@pytest.mark.django_db(transaction=True, serialized_rollback=True)
def test_an_operator_with_aws_gets_jobs_launched_on_ec2_by_the_qcluster(
    ec2,
    api_client,
    sft_dataset,
    ec2_endpoint,
    qcluster,  # noqa: F811
    settings,
):
    """VERI_PROVIDERS=local,aws for a real task cluster: the job launches on EC2 tagged with its
    id, and cancelling it terminates the instance."""
    qcluster(
        VERI_PROVIDERS="local,aws",
        AWS_ENDPOINT_URL=ec2.url,
        VERI_AWS_AMI_ID=settings.VERI_AWS_AMI_ID,
        VERI_STORE=settings.VERI_STORE,
    )
    job = submit_aws(api_client, sft_dataset)
    deadline = time.monotonic() + 60
    while not Instance.objects.filter(job=job).exclude(external_id="").exists():
        assert time.monotonic() < deadline, "the qcluster never launched the job"
        time.sleep(0.2)
    [instance] = instances(ec2_endpoint)
    assert {t["Key"]: t["Value"] for t in instance["Tags"]}[JOB_TAG] == job.public_id
    assert api_client.post(f"/v1/training_jobs/{job.public_id}/cancel").status_code == 200
    [after] = instances(ec2_endpoint)
    assert after["State"]["Name"] == "terminated"


def test_a_full_vcpu_quota_is_quota_exceeded_before_anything_is_launched(
    ec2, api_client, sft_dataset, ec2_endpoint
):
    ec2.quotas["L-DB2E81BA"] = 4  # G instances: room for one g6.xlarge
    first = submit_aws(api_client, sft_dataset)
    tasks.provision_job(job_id=first.pk)
    assert len(instances(ec2_endpoint)) == 1
    second = submit_aws(api_client, sft_dataset)
    tasks.provision_job(job_id=second.pk)
    second.refresh_from_db()
    assert (second.status, second.error_code) == ("failed", "QUOTA_EXCEEDED")
    assert "L-DB2E81BA allows 4 vCPUs" in second.error_message
    assert len(ec2.calls("RunInstances")) == 1  # the second was never asked of EC2


def test_an_image_that_cannot_be_looked_up_is_the_platforms_provisioning_error(
    ec2, api_client, sft_dataset, ec2_endpoint, settings
):
    """Without VERI_AWS_AMI_ID the image is the region's public SSM parameter; when SSM cannot
    answer it (here moto has no such parameter: ParameterNotFound, as an account without the
    lookup permission gets AccessDeniedException), no zone is tried and the job does not end as
    the customer's "no capacity"."""
    settings.VERI_AWS_AMI_ID = None
    job = submit_aws(api_client, sft_dataset, max_launch_attempts=3)
    assert tasks.provision_job(job_id=job.pk) == "provisioning_error"
    assert_provisioning_error(
        api_client, job, "aws refused", "ParameterNotFound", "VERI_AWS_AMI_ID", "nothing is billed"
    )
    assert ec2.calls("RunInstances") == [] and instances(ec2_endpoint) == []
    assert list(LaunchAttempt.objects.filter(job=job).values_list("outcome", flat=True)) == [
        "error"
    ]


@pytest.mark.parametrize(
    ("code", "message", "status"),
    [
        ("AuthFailure", "AWS was not able to validate the provided access credentials", 401),
        ("UnauthorizedOperation", "You are not authorized to perform this operation.", 403),
        ("InvalidAMIID.NotFound", "The image id '[ami-0123456789abcdef0]' does not exist", 400),
        ("InvalidParameterValue", "Value (gp9) for parameter volumeType is invalid.", 400),
        (
            "Unsupported",
            "The instance configuration for this AWS Marketplace product is not supported.",
            400,
        ),
    ],
)
def test_ec2_refusals_that_are_not_capacity_end_as_provisioning_error_at_once(
    ec2, api_client, sft_dataset, ec2_endpoint, code, message, status
):
    for zone in ZONES:
        ec2.refusals[zone] = (code, message, status)
    job = submit_aws(api_client, sft_dataset, max_launch_attempts=3)
    tasks.provision_job(job_id=job.pk)
    assert_provisioning_error(api_client, job, f"{code}: {message}")
    assert len(ec2.calls("RunInstances")) == 1  # the same answer in every zone: asked once


def test_a_type_ec2_does_not_offer_in_a_zone_is_capacity_and_tries_the_next(
    ec2, api_client, sft_dataset, ec2_endpoint
):
    ec2.refusals[ZONES[0]] = (
        "Unsupported",
        f"Your requested instance type (g6.xlarge) is not supported in your requested "
        f"Availability Zone ({ZONES[0]}). Please retry your request by not specifying an "
        f"Availability Zone or choosing {ZONES[1]}.",
        400,
    )
    job = submit_aws(api_client, sft_dataset)
    assert tasks.provision_job(job_id=job.pk) == "launched"
    [instance] = instances(ec2_endpoint)
    assert instance["Placement"]["AvailabilityZone"] == ZONES[1]


def test_a_launch_whose_answer_is_lost_runs_one_instance(
    ec2, ec2_endpoint, api_client, sft_dataset
):
    """boto3 retries a RunInstances answered 503; its ClientToken makes EC2 answer the first
    launch rather than start a second instance. This held before Veri named the token too:
    botocore fills in RunInstances' ClientToken (an `idempotencyToken` in EC2's service model)
    and keeps it across its retries. The test fails when EC2's idempotency is not honoured
    (the proxy answering a repeated token by launching again)."""
    ec2.lose_next_launch = True
    job = submit_aws(api_client, sft_dataset)
    tasks.provision_job(job_id=job.pk)
    job.refresh_from_db()
    assert job.status == "provisioning", (job.error_code, job.error_message)
    [instance] = [i for i in instances(ec2_endpoint) if i["State"]["Name"] != "terminated"]
    assert Instance.objects.get(job=job).external_id == f"us-east-1/{instance['InstanceId']}"
    launches = ec2.calls("RunInstances")
    assert len(launches) == 2 and launches[0]["ClientToken"] == launches[1]["ClientToken"]
