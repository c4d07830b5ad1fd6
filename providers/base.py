"""What every provider adapter does: launch a worker in a zone, report on it, terminate it."""

from dataclasses import dataclass, field

from veri.errors import ServiceUnavailable


class ProviderError(Exception):
    """A launch the provider refused; subclasses say why."""


class ProviderUnavailable(ProviderError, ServiceUnavailable):
    """The provider's API could not be reached, or kept failing with its own server errors: a
    request that needed it answers 503 with `Retry-After` (never a 500); tasks try again on their
    next run."""

    code = "provider_unavailable"
    retry_after_seconds = 10


class CapacityError(ProviderError):
    """No capacity for this shape in this zone: try the next zone."""


class QuotaError(ProviderError):
    """Veri's own account limit on this provider is full (a platform problem)."""


class FundsError(ProviderError):
    """Veri's prepaid balance with this provider ran out (a platform problem)."""


class NoFreeSlot(ProviderError):
    """Every slot is busy: the job waits in `queued` and is tried again."""


class ControlPlaneUnreachable(ProviderError):
    """A worker launched now could not call the control plane back (`VERI_PUBLIC_URL`)."""


def scoped_id(where: str, name: str) -> str:
    """Veri's id of a machine whose provider names it per region or zone: `where/name`."""
    return f"{where}/{name}"


def split_scoped_id(external: str) -> tuple[str, str]:
    where, _, name = external.partition("/")
    return where, name


@dataclass(frozen=True, slots=True)
class LaunchSpec:
    job_id: str
    region: str
    zone: str
    gpu_type: str
    gpu_count: int
    api_url: str
    env: dict[str, str] = field(default_factory=dict)  # the worker's environment, token included
    # The worker's command after `python -m worker`; empty: run the job `job_id` (a replica of a
    # deployment runs `serve --replica ID --api URL`, its id standing in `job_id`).
    worker_args: tuple[str, ...] = ()
    # Whose worker routes the machine calls (`/v1/worker/{kind}/{job_id}/…`) with which token:
    # a training job's, or a deployment's replica's.
    kind: str = "jobs"
    # The id in those routes; empty: `job_id` (a Tinker model's machine is tagged `tinker-<pk>`,
    # which providers' tags and labels take, and calls its model's routes by its model id).
    route_id: str = ""
    # A pip requirement the bootstrap installs in a virtualenv of its own, its executables put on
    # the worker's PATH (vLLM, for a replica or a Tinker model's sampler); empty: none.
    engine_requirement: str = ""

    def worker_command(self) -> tuple[str, ...]:
        return self.worker_args or ("run", "--job", self.job_id, "--api", self.api_url)


@dataclass(frozen=True, slots=True)
class InstanceState:
    alive: bool
    ready: bool = True  # False while the provider still looks for the machine (Flex-start)
    reason: str | None = (
        None  # why it ended, when the provider says: "reclaimed", "max_run_duration"
    )
    # Where the control plane reaches the machine, as the provider reports it (its public IP,
    # or its private one under VERI_SERVING_PRIVATE_NETWORK); None: the provider names none.
    address: str | None = None


class ProviderAdapter:
    name: str
    availability_ttl_seconds = 60  # how long an answer of available_regions is reused
    max_run_seconds: int | None = None  # the provider ends a machine after this long
    # A request the provider fulfils later (GCP Flex-start): the job stays `queued`, unbilled,
    # until the machine is there (`InstanceState.ready`).
    waits_for_capacity = False
    # Whether a deployment's replica may run here: its serving port is opened to the control plane
    # (VERI_SERVING_ALLOWED_CIDR) at launch and the machine's address is known. A provider that
    # cannot do both refuses deployments (`provider_not_supported`) rather than rent a machine
    # that becomes ready but cannot be reached.
    serves_replicas = False
    # The ports a replica may serve on (those opened at launch); None: any (the local provider's
    # loopback).
    serving_ports: range | None = None

    def gpus_per_machine(self, gpu_type: str) -> int | None:
        """How many GPUs the smallest machine with `gpu_type` that this provider rents carries
        (None: it rents none). A Tinker model takes one GPU and is billed for one, so it runs
        only where a machine of one exists."""
        return 1  # unless an adapter says otherwise, it rents the count asked for

    def max_instances(self) -> int | None:
        """How many machines this deployment may hold on the provider at once (None: no limit
        of ours); a launch beyond it waits in `queued` for a free slot, oldest job first."""
        return None

    def is_configured(self) -> bool:
        """Whether this deployment has what the adapter needs (credentials) to launch."""
        raise NotImplementedError

    def launch(self, spec: LaunchSpec) -> str:
        """Start an instance running the worker; returns the provider's instance id."""
        raise NotImplementedError

    def states(self, instance_ids: list[str]) -> dict[str, InstanceState]:
        """One call for many instances (watchdogs ask about every active job each tick)."""
        raise NotImplementedError

    def replica_address(self, instance_id: str) -> str | None:
        """Where the control plane reaches a replica's machine: what the provider reports of it,
        never what the machine says of itself."""
        state = self.states([instance_id]).get(instance_id)
        return state.address if state is not None and state.alive else None

    def terminate(self, instance_id: str) -> None:
        """Stop the instance and everything on it; terminating a gone instance is fine."""
        raise NotImplementedError

    def tagged_instances(self) -> dict[str, str]:
        """This deployment's machines that are not gone yet, each with the job id it was tagged
        with ("" when the tag is missing); the orphan sweeper terminates those of ended jobs."""
        return {}

    def available_regions(self, gpu_type: str) -> list[str] | None:
        """Regions where `gpu_type` can launch right now, as the provider reports; None when it
        does not say (capacity is then found out by launching)."""
        return None

    def preemption_notice(self, job_id: str) -> str | None:
        """Where the worker learns that its machine is about to be taken away (its
        VERI_WORKER_PREEMPTION_NOTICE: `aws`, `gcp`, `file:PATH`), or None when this provider
        gives no warning."""
        return None

    def model_problem(self, base_model: str) -> str | None:
        """Why this provider's workers could not load the hub model `base_model`, or None.
        Rented machines reach the model hub."""
        return None
