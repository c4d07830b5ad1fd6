"""AWS EC2 through boto3: on-demand GPU instances in Veri's own account, tagged with the job, booted
with the worker's bootstrap as user-data. Credentials come from boto3's chain (AWS_* variables, a
profile, an instance role); AWS_ENDPOINT_URL points it elsewhere (tests use moto)."""

import uuid
from functools import cache

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError, HTTPClientError, NoCredentialsError
from botocore.exceptions import ConnectionError as BotoConnectionError
from django.conf import settings

from providers import bootstrap, catalog
from providers.base import (
    CapacityError,
    InstanceState,
    LaunchSpec,
    ProviderAdapter,
    ProviderError,
    ProviderUnavailable,
    QuotaError,
    scoped_id,
    split_scoped_id,
)
from veri.services import deployment_id
from worker.serve_vllm import PORTS

JOB_TAG = "veri:job"
DEPLOYMENT_TAG = "veri:deployment"  # several deployments may share one AWS account
# The instance types of each catalog GPU by how many GPUs they carry; a job gets the smallest
# that holds its gpu_count.
INSTANCE_TYPES: dict[str, tuple[tuple[int, str], ...]] = {
    "L4-24GB": ((1, "g6.xlarge"), (4, "g6.12xlarge"), (8, "g6.48xlarge")),
    "A10G-24GB": ((1, "g5.xlarge"), (4, "g5.12xlarge"), (8, "g5.48xlarge")),
    "A100-80GB": ((8, "p4de.24xlarge"),),
    "H100-80GB": ((8, "p5.48xlarge"),),
}
# Service Quotas' codes for running on-demand instances, in vCPUs, by instance family letter.
VCPU_QUOTAS = {"g": "L-DB2E81BA", "p": "L-417A185B"}  # G and VT; P
QUOTA_FAMILIES = {"g": ("g", "vt"), "p": ("p",)}  # the instance types each quota counts
CAPACITY_CODES = {"InsufficientInstanceCapacity", "InsufficientCapacity"}
# `Unsupported` is a capacity answer only when it says the type is not offered in the zone asked
# for; it also answers an image that cannot run the type, which is configuration.
ZONE_UNSUPPORTED = "Availability Zone"
QUOTA_CODES = {"VcpuLimitExceeded", "InstanceLimitExceeded", "MaxSpotInstanceCountExceeded"}
GONE_STATES = {"shutting-down", "terminated", "stopping", "stopped"}
# The states the sweeper terminates: a stopped (or stopping) instance still bills its EBS volumes
# (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/ec2-instance-lifecycle.html, "Instance
# states"); shutting-down and terminated ones no longer bill and are ending on their own.
BILLED_STATES = ["pending", "running", "stopping", "stopped"]
# The DLAMI with NVIDIA drivers and Python 3, published by AWS per region.
# The security group of this deployment's replicas: their serving ports open to
# VERI_SERVING_ALLOWED_CIDR (a job's machine needs no inbound port and keeps the VPC's default).
SERVING_GROUP_PREFIX = "veri-serving-"
DEFAULT_AMI_PARAMETER = (
    "/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-ubuntu-22.04/latest/ami-id"
)


def instance_type(gpu_type: str, gpu_count: int) -> str | None:
    return next((t for n, t in INSTANCE_TYPES.get(gpu_type, ()) if n >= gpu_count), None)


class AwsProvider(ProviderAdapter):
    name = "aws"
    serves_replicas = True
    serving_ports = PORTS

    @staticmethod
    @cache
    def client(service: str, region: str):
        return boto3.client(
            service,
            region_name=region,
            endpoint_url=settings.AWS_ENDPOINT_URL or None,
            config=Config(connect_timeout=10, read_timeout=30, retries={"mode": "standard"}),
        )

    def gpus_per_machine(self, gpu_type: str) -> int | None:
        return min((n for n, _ in INSTANCE_TYPES.get(gpu_type, ())), default=None)

    def preemption_notice(self, job_id: str) -> str:
        """An interruption notice (spot: two minutes ahead), from the instance metadata."""
        return "aws"

    def is_configured(self) -> bool:
        return boto3.Session().get_credentials() is not None

    def regions(self) -> list[str]:
        return list(catalog.get_provider(self.name).zones)

    def image_id(self, region: str) -> str:
        """VERI_AWS_AMI_ID, else the region's Deep Learning AMI from its public SSM parameter.
        A lookup that fails is a `ProviderError` in AWS's words (never a capacity answer)."""
        if settings.VERI_AWS_AMI_ID:
            return settings.VERI_AWS_AMI_ID
        try:
            answer = self.client("ssm", region).get_parameter(Name=DEFAULT_AMI_PARAMETER)
            return answer["Parameter"]["Value"]
        except ClientError as exc:
            raise ProviderError(
                f"the machine image could not be looked up in {region} (SSM parameter "
                f"{DEFAULT_AMI_PARAMETER}; set VERI_AWS_AMI_ID to skip the lookup): "
                f"{_aws_message(exc)}"
            ) from exc
        except BotoCoreError as exc:
            raise ProviderError(
                f"the machine image could not be looked up in {region}: {exc}"
            ) from exc

    def quota_problem(self, region: str, kind: str) -> str | None:
        """Why Veri's vCPU quota for `kind`'s family cannot take one more, from Service Quotas and
        the instances running; None when it can, or when AWS does not say (the launch finds out)."""
        family = kind[0]
        try:
            quota = self.client("service-quotas", region).get_service_quota(
                ServiceCode="ec2", QuotaCode=VCPU_QUOTAS[family]
            )["Quota"]["Value"]
            running = [
                i
                for i in self._describe(
                    region,
                    Filters=[{"Name": "instance-state-name", "Values": ["pending", "running"]}],
                )
                if i["InstanceType"].startswith(QUOTA_FAMILIES[family])
            ]
            kinds = sorted({kind} | {i["InstanceType"] for i in running})
            vcpus = {
                t["InstanceType"]: t["VCpuInfo"]["DefaultVCpus"]
                for t in self.client("ec2", region).describe_instance_types(InstanceTypes=kinds)[
                    "InstanceTypes"
                ]
            }
        except (ClientError, BotoCoreError, KeyError):
            return None
        used = sum(vcpus.get(i["InstanceType"], 0) for i in running)
        needed = vcpus.get(kind, 0)
        if used + needed <= quota:
            return None
        return (
            f"{VCPU_QUOTAS[family]} allows {quota:g} vCPUs of {family.upper()} instances in "
            f"{region}; {used} are in use and {kind} needs {needed}"
        )

    def launch(self, spec: LaunchSpec) -> str:
        kind = instance_type(spec.gpu_type, spec.gpu_count)
        if kind is None:
            raise CapacityError(f"EC2 has no instance type with {spec.gpu_count}x {spec.gpu_type}")
        if problem := self.quota_problem(spec.region, kind):
            raise QuotaError(problem)
        tags = [
            {"Key": JOB_TAG, "Value": spec.job_id},
            {"Key": DEPLOYMENT_TAG, "Value": deployment_id()},
            {"Key": "Name", "Value": f"veri {spec.job_id}"},
        ]
        image = self.image_id(spec.region)
        groups = (
            {"SecurityGroupIds": [self.serving_group(spec.region)]}
            if spec.kind == "replicas"
            else {}
        )
        try:
            answer = self.client("ec2", spec.region).run_instances(
                # boto3 retries a RunInstances whose answer was lost; the same client token
                # makes EC2 answer the first request's instance instead of launching a second
                # (https://docs.aws.amazon.com/ec2/latest/devguide/ec2-api-idempotency.html).
                # botocore would fill one in (an `idempotencyToken` in EC2's service model);
                # naming it here keeps the guarantee from resting on that.
                ClientToken=str(uuid.uuid4()),
                ImageId=image,
                InstanceType=kind,
                **groups,
                MinCount=1,
                MaxCount=1,
                Placement={"AvailabilityZone": spec.zone},
                UserData=bootstrap.render(spec),
                InstanceInitiatedShutdownBehavior="terminate",
                BlockDeviceMappings=[
                    {
                        "DeviceName": "/dev/sda1",
                        "Ebs": {"VolumeSize": settings.VERI_AWS_DISK_GB, "VolumeType": "gp3"},
                    }
                ],
                TagSpecifications=[
                    {"ResourceType": "instance", "Tags": tags},
                    {"ResourceType": "volume", "Tags": tags},
                ],
            )
        except ClientError as exc:
            code, message = exc.response.get("Error", {}).get("Code", ""), _aws_message(exc)
            if code in CAPACITY_CODES or (code == "Unsupported" and ZONE_UNSUPPORTED in message):
                raise CapacityError(f"{kind} in {spec.zone}: {message}") from exc
            if code in QUOTA_CODES:
                raise QuotaError(f"{kind} in {spec.region}: {message}") from exc
            raise ProviderError(f"EC2 refused {kind} in {spec.zone}: {message}") from exc
        except BotoCoreError as exc:  # unreachable, or no credentials at all
            raise ProviderError(f"EC2 could not be called: {exc}") from exc
        return scoped_id(spec.region, answer["Instances"][0]["InstanceId"])

    def serving_group(self, region: str) -> str:
        """The id of this deployment's serving security group in `region` (in the default VPC,
        where replicas launch), made on first use, its rule (PORTS from
        VERI_SERVING_ALLOWED_CIDR) added when missing: a changed CIDR is added beside the old one,
        which an operator removes."""
        ec2 = self.client("ec2", region)
        name = SERVING_GROUP_PREFIX + deployment_id()
        try:
            found = ec2.describe_security_groups(
                Filters=[{"Name": "group-name", "Values": [name]}]
            )["SecurityGroups"]
            if found:
                group = found[0]["GroupId"]
            else:
                group = ec2.create_security_group(
                    GroupName=name, Description="Veri replicas' serving ports"
                )["GroupId"]
            ec2.authorize_security_group_ingress(
                GroupId=group,
                IpPermissions=[
                    {
                        "IpProtocol": "tcp",
                        "FromPort": PORTS.start,
                        "ToPort": PORTS.stop - 1,
                        "IpRanges": [{"CidrIp": settings.VERI_SERVING_ALLOWED_CIDR}],
                    }
                ],
            )
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") != "InvalidPermission.Duplicate":
                raise ProviderError(
                    f"the serving security group could not be set up in {region}: "
                    f"{_aws_message(exc)}"
                ) from exc
        except BotoCoreError as exc:
            raise ProviderError(f"EC2 could not be called: {exc}") from exc
        return group

    def _describe(self, region: str, **query) -> list[dict]:
        pages = self.client("ec2", region).get_paginator("describe_instances").paginate(**query)
        return [i for page in pages for r in page["Reservations"] for i in r["Instances"]]

    def states(self, instance_ids: list[str]) -> dict[str, InstanceState]:
        by_region: dict[str, list[str]] = {}
        for external in instance_ids:
            region, instance_id = split_scoped_id(external)
            by_region.setdefault(region, []).append(instance_id)
        found: dict[str, InstanceState] = {}
        for region, ids in by_region.items():
            for instance in self._describe(
                region, Filters=[{"Name": "instance-id", "Values": ids}]
            ):
                state = instance["State"]["Name"]
                reason = instance.get("StateReason", {}).get("Code", "")
                reclaimed = "SpotInstanceTermination" in reason or reason == "Server.InternalError"
                found[scoped_id(region, instance["InstanceId"])] = InstanceState(
                    alive=state not in GONE_STATES,
                    reason="reclaimed" if state in GONE_STATES and reclaimed else None,
                    address=instance.get(
                        "PrivateIpAddress"
                        if settings.VERI_SERVING_PRIVATE_NETWORK
                        else "PublicIpAddress"
                    ),
                )
        # An instance EC2 no longer lists is gone.
        return {i: found.get(i, InstanceState(alive=False)) for i in instance_ids}

    def terminate(self, instance_id: str) -> None:
        region, ec2_id = split_scoped_id(instance_id)
        try:
            self.client("ec2", region).terminate_instances(InstanceIds=[ec2_id])
        except (BotoConnectionError, HTTPClientError) as exc:
            raise ProviderUnavailable(f"EC2 could not be reached ({type(exc).__name__})") from exc
        except ClientError as exc:
            if exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) >= 500:
                raise ProviderUnavailable(f"EC2 kept failing ({exc})") from exc
            if exc.response.get("Error", {}).get("Code") != "InvalidInstanceID.NotFound":
                raise

    def tagged_instances(self) -> dict[str, str]:
        """Every instance of this deployment that is not yet gone, with the job it was for."""
        found = {}
        for region in self.regions():
            for instance in self._describe(
                region,
                Filters=[
                    {"Name": f"tag:{DEPLOYMENT_TAG}", "Values": [deployment_id()]},
                    {"Name": "instance-state-name", "Values": BILLED_STATES},
                ],
            ):
                tags = {t["Key"]: t["Value"] for t in instance.get("Tags", [])}
                found[scoped_id(region, instance["InstanceId"])] = tags.get(JOB_TAG, "")
        return found

    def available_regions(self, gpu_type: str) -> list[str] | None:
        """Regions that offer the 1-GPU (or smallest) shape in some zone."""
        kind = instance_type(gpu_type, 1)
        if kind is None:
            return []
        regions = []
        try:
            for region in self.regions():
                offers = self.client("ec2", region).describe_instance_type_offerings(
                    LocationType="availability-zone",
                    Filters=[{"Name": "instance-type", "Values": [kind]}],
                )
                if offers["InstanceTypeOfferings"]:
                    regions.append(region)
        except (ClientError, BotoCoreError, NoCredentialsError):
            return None  # EC2 did not say: capacity is found out by launching
        return regions


def _aws_message(exc: ClientError) -> str:
    """`Code: Message`, as AWS answered."""
    error = exc.response.get("Error", {})
    return f"{error.get('Code', '')}: {error.get('Message', '')}"
