"""Google Cloud through `google-cloud-compute`: one Flex-start GPU VM per job (GCP finds the GPU
and holds it for the run duration Veri asks, 24 hours, then deletes the VM), labelled with the
job and this deployment, booted with the worker's bootstrap as its startup script. One GPU at a
time per deployment, as Flex-start quotas are; a second job waits in `queued`. Credentials come from
GOOGLE_APPLICATION_CREDENTIALS (or the environment's default); VERI_GCP_API_URL points it
elsewhere."""

import concurrent.futures
import contextlib
import re
import time
import uuid
from functools import cache

import requests
from django.conf import settings
from google.api_core import exceptions as gcp_errors
from google.api_core.client_options import ClientOptions
from google.auth.credentials import AnonymousCredentials
from google.cloud import compute_v1

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

MACHINE_TYPES = {"A100-80GB": "a2-ultragpu-1g", "H100-80GB": "a3-highgpu-1g"}
ACCELERATORS = {"A100-80GB": "nvidia-a100-80gb", "H100-80GB": "nvidia-h100-80gb"}
# What Veri asks of Flex-start: GCP deletes the VM after this long. Flex-start allows up to
# seven days (https://cloud.google.com/compute/docs/instances/about-flex-start-vms, "Flex-start
# VM limited run duration"); a day bounds what a runaway job can cost.
MAX_RUN_SECONDS = 24 * 3600
# A VM in these states runs no worker. TERMINATED is a stopped VM, not a deleted one: its disks
# (and any reserved address) still bill (https://cloud.google.com/compute/docs/instances/
# instance-lifecycle, "TERMINATED"); a deleted VM is no longer listed. So the sweeper deletes a
# VM of this deployment in every state.
GONE = {"STOPPING", "STOPPED", "SUSPENDING", "SUSPENDED", "TERMINATED"}
READY = {"STAGING", "RUNNING"}  # the GPU is ours (PROVISIONING: Flex-start still looks)
CAPACITY = re.compile(r"RESOURCE_POOL_EXHAUSTED|does not have enough resources|STOCKOUT", re.I)
QUOTA = re.compile(r"QUOTA_EXCEEDED|quotaExceeded|quota .* exceeded", re.I)
# How long a launch waits on the insert operation. Flex-start may hold the request until it
# finds the GPU: past this the job stays `queued` and the watchdog follows the VM instead.
INSERT_WAIT_SECONDS = 120
OPERATION_POLL_SECONDS = 2.0
INSERT_ATTEMPTS = 3  # an insert whose answer was lost is sent again with the same request id
# Machine series whose VMs need the gVNIC network interface
# (https://cloud.google.com/compute/docs/gpus/create-gpu-vm-accelerator-optimized: A3 "requires
# gVNIC"; https://cloud.google.com/compute/docs/networking/using-gvnic).
GVNIC_SERIES = ("a3-",)


def instance_name(job_id: str) -> str:
    """GCE names are lower-case letters, digits and dashes."""
    return "veri-" + job_id.lower().replace("_", "-")


class GcpProvider(ProviderAdapter):
    name = "gcp"
    # A VM that GCP took back after this long reached the run duration Veri asked for (the
    # watchdog's verdict), not a limit of Flex-start's own, which allows up to seven days.
    max_run_seconds = MAX_RUN_SECONDS
    waits_for_capacity = True  # Flex-start finds the GPU within about 15 minutes

    @staticmethod
    @cache
    def client(kind=compute_v1.InstancesClient):
        options = ClientOptions(api_endpoint=settings.VERI_GCP_API_URL or None)
        # A test double needs no Google credentials; everything else uses the default chain.
        anonymous = settings.VERI_GCP_API_URL and not settings.GOOGLE_APPLICATION_CREDENTIALS
        return kind(
            credentials=AnonymousCredentials() if anonymous else None,
            client_options=options,
            transport="rest",
        )

    def preemption_notice(self, job_id: str) -> str:
        """A preemption or a host-maintenance termination, from the metadata server."""
        return "gcp"

    def is_configured(self) -> bool:
        return bool(settings.VERI_GCP_PROJECT) and bool(
            settings.GOOGLE_APPLICATION_CREDENTIALS or settings.VERI_GCP_API_URL
        )

    def max_instances(self) -> int:
        return settings.VERI_GCP_MAX_GPUS

    def launch(self, spec: LaunchSpec) -> str:
        machine = MACHINE_TYPES.get(spec.gpu_type)
        if machine is None or spec.gpu_count != 1:
            raise CapacityError("GCP Flex-start offers 1x A100-80GB or H100-80GB, not this shape")
        name = instance_name(spec.job_id)
        instance = compute_v1.Instance(
            name=name,
            machine_type=f"zones/{spec.zone}/machineTypes/{machine}",
            labels={"veri-job": spec.job_id.lower(), "veri-deployment": deployment_id()},
            metadata=compute_v1.Metadata(
                items=[compute_v1.Items(key="startup-script", value=bootstrap.render(spec))]
            ),
            # The Flex-start request as https://cloud.google.com/compute/docs/instances/
            # create-flex-start-vm gives it: FLEX_START with a termination action and a run
            # duration, host maintenance TERMINATE, and no reservation consumed.
            scheduling=compute_v1.Scheduling(
                provisioning_model="FLEX_START",
                instance_termination_action="DELETE",
                max_run_duration=compute_v1.Duration(seconds=MAX_RUN_SECONDS),
                on_host_maintenance="TERMINATE",
                automatic_restart=False,
            ),
            reservation_affinity=compute_v1.ReservationAffinity(
                consume_reservation_type="NO_RESERVATION"
            ),
            disks=[
                compute_v1.AttachedDisk(
                    boot=True,
                    auto_delete=True,
                    initialize_params=compute_v1.AttachedDiskInitializeParams(
                        source_image=settings.VERI_GCP_IMAGE,
                        disk_size_gb=settings.VERI_GCP_DISK_GB,
                    ),
                )
            ],
            network_interfaces=[
                compute_v1.NetworkInterface(
                    network="global/networks/default",
                    **({"nic_type": "GVNIC"} if machine.startswith(GVNIC_SERIES) else {}),
                )
            ],
        )
        try:
            # A stockout is the operation's error, not the call's.
            self._wait(spec.zone, self._insert(spec.zone, instance))
        except concurrent.futures.TimeoutError:
            # Flex-start is still looking for the GPU: the VM exists (PROVISIONING) and the job
            # stays queued and unbilled; the watchdog follows the VM's status, and a request GCP
            # gives up on leaves no VM, which fails the job with no capacity.
            return scoped_id(spec.zone, name)
        except gcp_errors.GoogleAPICallError as exc:
            if CAPACITY.search(str(exc)):
                raise CapacityError(f"{machine} in {spec.zone}: {exc.message}") from exc
            # Quota is a 403 naming the quota; a bare 403 is a permission refused (credentials
            # or IAM), which is configuration, not an account limit.
            if QUOTA.search(str(exc)):
                raise QuotaError(f"{machine} in {spec.zone}: {exc.message}") from exc
            raise ProviderError(f"GCP refused {machine} in {spec.zone}: {exc.message}") from exc
        return scoped_id(spec.zone, name)

    def _insert(self, zone: str, instance: compute_v1.Instance):
        """instances.insert, sent again with the same request id when its answer is lost (a
        server error or a dropped connection): GCP then answers the first request's operation
        rather than creating a second VM (https://cloud.google.com/compute/docs/reference/rest/
        v1/instances/insert, `requestId`)."""
        request_id = str(uuid.uuid4())
        for attempt in range(INSERT_ATTEMPTS):
            try:
                return self.client().insert(
                    request=compute_v1.InsertInstanceRequest(
                        project=settings.VERI_GCP_PROJECT,
                        zone=zone,
                        instance_resource=instance,
                        request_id=request_id,
                    )
                )
            except (requests.ConnectionError, requests.Timeout, gcp_errors.ServerError) as exc:
                if CAPACITY.search(str(exc)):
                    raise  # a stockout answered as the call's error: the caller's to classify
                if attempt == INSERT_ATTEMPTS - 1:
                    raise ProviderUnavailable(
                        f"GCP could not be reached ({type(exc).__name__})"
                    ) from exc
        raise AssertionError("unreachable")

    def _wait(self, zone: str, operation) -> None:
        """Poll a zone operation until it is done, then raise its error as the client library
        would (a GoogleAPICallError); concurrent.futures.TimeoutError past INSERT_WAIT_SECONDS.
        Polled here rather than with `operation.result()`, whose polling client ignores the
        configured endpoint (it always asks compute.googleapis.com)."""
        deadline = time.monotonic() + INSERT_WAIT_SECONDS
        while operation.status != compute_v1.Operation.Status.DONE:
            left = deadline - time.monotonic()
            if left <= 0:
                raise concurrent.futures.TimeoutError(f"operation {operation.name} still running")
            time.sleep(min(OPERATION_POLL_SECONDS, left))
            operation = self.client(compute_v1.ZoneOperationsClient).get(
                project=settings.VERI_GCP_PROJECT, zone=zone, operation=operation.name
            )
        errors = list(operation.error.errors) if operation.error else []
        if operation.http_error_status_code or errors:
            message = operation.http_error_message or "; ".join(e.message for e in errors)
            raise gcp_errors.from_http_status(
                operation.http_error_status_code or 500, message, errors=errors
            )

    def _vms(self) -> dict[str, compute_v1.Instance]:
        """This deployment's VMs in every zone, by Veri's id, in one aggregated list."""
        request = compute_v1.AggregatedListInstancesRequest(
            project=settings.VERI_GCP_PROJECT, filter=f"labels.veri-deployment={deployment_id()}"
        )
        return {
            scoped_id(zone_path.removeprefix("zones/"), vm.name): vm
            for zone_path, scoped in self.client().aggregated_list(request=request)
            for vm in scoped.instances
        }

    def states(self, instance_ids: list[str]) -> dict[str, InstanceState]:
        """A VM GCP deleted or stopped was taken back (after 24 h, the watchdog says so)."""
        vms = self._vms()
        answer = {}
        for external in instance_ids:
            status = vms[external].status if external in vms else "DELETED"
            alive = status not in GONE and status != "DELETED"
            answer[external] = InstanceState(
                alive=alive,
                ready=status in READY,
                reason=None if alive else "reclaimed",
            )
        return answer

    def terminate(self, instance_id: str) -> None:
        zone, name = split_scoped_id(instance_id)
        try:
            with contextlib.suppress(gcp_errors.NotFound):  # already gone
                self.client().delete(project=settings.VERI_GCP_PROJECT, zone=zone, instance=name)
        except (requests.ConnectionError, requests.Timeout, gcp_errors.ServerError) as exc:
            raise ProviderUnavailable(f"GCP could not be reached ({type(exc).__name__})") from exc

    def tagged_instances(self) -> dict[str, str]:
        """Every listed VM of this deployment, TERMINATED ones too (their disks bill)."""
        return {external: vm.labels.get("veri-job", "") for external, vm in self._vms().items()}

    def available_regions(self, gpu_type: str) -> list[str] | None:
        """Regions with a zone that offers the GPU (Flex-start finds out at request time whether
        one is free)."""
        accelerator = ACCELERATORS.get(gpu_type)
        if accelerator is None:
            return []
        request = compute_v1.AggregatedListAcceleratorTypesRequest(
            project=settings.VERI_GCP_PROJECT, filter=f"name={accelerator}"
        )
        try:
            pages = self.client(compute_v1.AcceleratorTypesClient).aggregated_list(request=request)
            zones = {
                zone.removeprefix("zones/") for zone, scoped in pages if scoped.accelerator_types
            }
        except gcp_errors.GoogleAPICallError:
            return None
        spec = catalog.get_provider(self.name)
        return [region for region, names in spec.zones.items() if zones & set(names)]
