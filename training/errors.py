"""The failure catalog: every `error.code` a job can end with, who it belongs to, what billing
does about it, and what to do. Nothing else decides attribution or billing."""

from dataclasses import dataclass
from enum import StrEnum


class Attribution(StrEnum):
    CUSTOMER = "customer"
    PLATFORM = "platform"
    PENDING = "pending"  # unclear from the evidence: an operator reviews it


class Billing(StrEnum):
    CHARGE = "charged"
    REFUND = "credited automatically"
    REVIEW = "reviewed before credit"
    NONE = "nothing billed"


@dataclass(frozen=True, slots=True)
class JobError:
    code: str
    attribution: Attribution
    billing: Billing
    cause: str
    hint: str  # the "what to do" sentence
    # A platform fault after launch that a restart from the newest checkpoint can outlive.
    restarts: bool = False


C, P, Q = Attribution.CUSTOMER, Attribution.PLATFORM, Attribution.PENDING

CATALOG: dict[str, JobError] = {
    e.code: e
    for e in (
        JobError(
            "oom",
            C,
            Billing.CHARGE,
            "Model too large for the chosen GPU",
            "Drop to a smaller base, raise `gpu_count`, or shrink `max_response_length`.",
        ),
        JobError(
            "CAPACITY_UNAVAILABLE",
            C,
            Billing.NONE,
            "No GPU capacity for the requested type in any availability zone, after trying "
            "every capable zone (`max_launch_attempts`)",
            "Retry later, pick a different `gpu_type`, or launch in another region "
            '(`veri regions list`, then `region="..."`). Capacity is provider-side and not '
            "pre-checkable.",
        ),
        JobError(
            "QUOTA_EXCEEDED",
            P,
            Billing.NONE,
            "Veri's own account limit on the provider is full. A platform limit, not your "
            "account. Nothing booted and nothing is billed",
            "Retry in a few minutes, or resubmit with a shape the message names after `or use:`.",
        ),
        JobError(
            "PROVIDER_OUT_OF_FUNDS",
            P,
            Billing.NONE,
            "The provider refused the launch because Veri's own prepaid balance with it ran "
            "out. A platform problem, not your account. Nothing booted and nothing is billed",
            "Retry later, or resubmit with a shape the message names after `or use:`.",
        ),
        JobError(
            "launch_timeout",
            P,
            Billing.NONE,
            "The provider's GPU launch did not finish within its time limit and was stopped",
            "Re-submit; if it keeps happening, try another provider or `gpu_type`.",
        ),
        JobError(
            "provisioning_error",
            P,
            Billing.REFUND,
            "The instance booted but the worker did not come up",
            "Re-submit; if persistent, try a different `gpu_type`.",
            restarts=True,
        ),
        JobError(
            "provisioning_timeout",
            P,
            Billing.REFUND,
            "The instance never reached a running worker within the provisioning deadline",
            "Re-submit; capacity or boot was too slow.",
        ),
        JobError(
            "configuring_timeout",
            P,
            Billing.REFUND,
            "The worker booted but made no training progress within the configuring deadline",
            "Re-submit; if persistent, check the full log via "
            "`GET /v1/training_jobs/{id}/logs/full`.",
        ),
        JobError(
            "heartbeat_timeout",
            C,
            Billing.CHARGE,
            "Worker stopped reporting status for longer than `heartbeat_timeout_seconds` "
            "(likely OOM-killed or network dropped)",
            "Re-submit; if persistent, raise `gpu_count`.",
        ),
        JobError(
            "worker_failed",
            P,
            Billing.REVIEW,
            "The worker on the instance stopped reporting for more than 15 minutes, or the "
            "instance ended before the worker reported a result",
            "Re-submit, or resume from the newest checkpoint with `resume_from` "
            "(`veri jobs resume <id>`); if it repeats, report the job id.",
            restarts=True,
        ),
        JobError(
            "training_error",
            C,
            Billing.CHARGE,
            "Worker crash, reward function error, or dataset loading error",
            "Read `error.message` and the full log via `GET /v1/training_jobs/{id}/logs/full`.",
        ),
        JobError(
            "distributed_error",
            Q,
            Billing.REVIEW,
            "Multi-GPU job: the GPUs stopped talking to each other (NCCL error, collective "
            "timeout, rendezvous failure)",
            "Re-submit once; if it repeats on the same configuration, report the job id.",
        ),
        JobError(
            "training_stalled",
            C,
            Billing.CHARGE,
            "Multi-GPU job: no progress line for the longer of 10 minutes and three times the "
            "median step time",
            "Check the log tail (it carries each GPU's stack); lower `micro_batch_size` or the "
            "sequence length.",
        ),
        JobError(
            "hardware_error",
            P,
            Billing.REFUND,
            "The box failed a hardware check (missing GPU, memory errors)",
            "Re-submit; this one is on the platform.",
            restarts=True,
        ),
        JobError(
            "upload_failed",
            P,
            Billing.REVIEW,
            "Training finished, but files of the final model could not be uploaded to Veri storage",
            "Re-submit; this one is on the platform, and the run is reviewed for a credit.",
        ),
        JobError(
            "provider_reclaimed",
            P,
            Billing.REFUND,
            "The provider deleted or stopped the VM (host error, maintenance, preemption) "
            "before the job finished",
            "Resume from the newest checkpoint with `resume_from` (`veri jobs resume <id>`).",
            restarts=True,
        ),
        JobError(
            "max_run_duration_reached",
            C,
            Billing.CHARGE,
            "The provider ended the VM at its 24-hour maximum run duration",
            "Lower `max_steps` or split the run; resume from the newest checkpoint with "
            "`resume_from`.",
        ),
        JobError(
            "config_error",
            C,
            Billing.CHARGE,
            "The job's configuration cannot run (a hyperparameter combination the trainer "
            "refuses, or an option this machine cannot do)",
            "Read `error.message`, fix the named setting, and re-submit.",
        ),
        JobError(
            "dependency_error",
            C,
            Billing.CHARGE,
            "A package the job needs is missing or failed to import",
            "Read `error.message` for the package; remove the import or pick a supported one.",
        ),
        JobError(
            "volume_sync_incomplete",
            P,
            Billing.REFUND,
            "Files of a mounted volume did not arrive complete on the worker",
            "Re-submit; the message names the files that were missing.",
        ),
        JobError(
            "volume_too_large_for_node",
            C,
            Billing.CHARGE,
            "The mounted volumes need more than 80% of the node's free disk",
            "Pick a larger GPU type (more disk), or mount fewer or smaller volumes.",
        ),
        JobError(
            "invalid_dataset",
            C,
            Billing.CHARGE,
            "A dataset row does not have what the method needs",
            "Fix the line the message names; see the README for each method's fields.",
        ),
        JobError(
            "budget_exceeded",
            C,
            Billing.CHARGE,
            "The job's cost reached its max_cost_usd; it saved a checkpoint (when it saves "
            "checkpoints) and stopped. Charged up to the cap, never past it",
            "Resume from the newest checkpoint with a higher max_cost_usd (veri jobs resume <id>).",
        ),
        JobError(
            "balance_exhausted",
            C,
            Billing.CHARGE,
            "The workspace's balance ran out; after a grace period the job saved a checkpoint "
            "(when it saves checkpoints) and stopped. A Tinker model saved its state and ended",
            "Add credit (veri billing top-up AMOUNT where card payments are on, else ask an "
            "operator), then resume from the newest checkpoint (a Tinker model: `load_state` "
            "the path its end's message names).",
        ),
        # A deployment's replicas (serving): attributed as jobs' faults are.
        JobError(
            "replica_start_timeout",
            P,
            Billing.NONE,
            "A replica of the deployment did not become ready in time and was stopped",
            "Nothing is billed for it; send a request again to start a new replica.",
        ),
        JobError(
            "replica_failed",
            P,
            Billing.REFUND,
            "A replica's serving process or machine stopped unexpectedly",
            "Requests in flight got an error; the next request starts a new replica.",
        ),
        JobError(
            "model_load_error",
            C,
            Billing.CHARGE,
            "The serving process could not load the base model or one of the adapters",
            "Check that every adapter was trained on the deployment's base model, then "
            "create the deployment again.",
        ),
        # A Tinker model's (tinker_api): how its worker ended, and what its uptime costs.
        JobError(
            "worker_lost",
            P,
            Billing.REFUND,
            "The Tinker model's machine or worker process stopped, not by the client; its "
            "uptime since the last save is credited",
            "Create a training client from the newest saved state (`load_state`) and go on.",
        ),
        JobError(
            "session_ended",
            C,
            Billing.CHARGE,
            "The Tinker session ended (no heartbeat for VERI_TINKER_SESSION_TIMEOUT_SECONDS, "
            "or the client closed it); each model's state was saved first",
            "Start a new ServiceClient and load the saved state its message names.",
        ),
        JobError(
            "budget_exhausted",
            C,
            Billing.CHARGE,
            "The Tinker session's uptime reached its budget cap (`veri_max_cost_usd`); each "
            "model saved its state and ended. Charged up to the cap, never past it",
            "Start a new session with a higher `veri_max_cost_usd` and load the saved state.",
        ),
    )
}

# Multi-GPU failures whose cause the evidence cannot tell: reviewed, never guessed.
PENDING_ON_MULTI_GPU = {"training_error", "distributed_error"}


def get(code: str) -> JobError:
    return CATALOG[code]


def attribution_for(code: str, *, gpu_count: int = 1) -> Attribution:
    if gpu_count > 1 and code in PENDING_ON_MULTI_GPU:
        return Attribution.PENDING
    return CATALOG[code].attribution


# A run's phases, in order, as the worker's runner reports them: syncing the volumes (from
# registering), its hardware check, the training (customer code runs: the reward functions,
# whatever the dataset makes it load), and finishing (every training process has ended; the
# runner checks the hardware again after a failure and uploads the final model).
PHASES = ("sync", "hardware", "training", "finishing")
# The platform faults a worker may report, each with the phases whose runner checks find it.
# Customer code runs in the training phase, so none of them is believed from there; every
# other code a worker reports (the customer's, or `pending` ones) is believed in any phase.
PLATFORM_FAULT_PHASES = {
    # "": the machine's bootstrap, before the worker registered; "hardware": torch cannot use
    # the GPUs the driver reports.
    "provisioning_error": {"", "hardware"},
    "volume_sync_incomplete": {"sync"},
    "hardware_error": {"hardware", "finishing"},
    "upload_failed": {"finishing"},
}


def believed(code: str, *, phase: str) -> bool:
    """Whether a worker's report of `code` can be taken in `phase`."""
    return code not in PLATFORM_FAULT_PHASES or phase in PLATFORM_FAULT_PHASES[code]


# Codes only the control plane decides; a worker may report every other one.
CONTROL_PLANE_CODES = {
    "CAPACITY_UNAVAILABLE",
    "QUOTA_EXCEEDED",
    "PROVIDER_OUT_OF_FUNDS",
    "launch_timeout",
    "provisioning_timeout",
    "configuring_timeout",
    "heartbeat_timeout",
    "worker_failed",
    "provider_reclaimed",
    "max_run_duration_reached",
}
# A deployment's codes: never a training job's end.
DEPLOYMENT_CODES = {"replica_start_timeout", "replica_failed", "model_load_error"}
# A Tinker model's codes (tinker_api decides them): never a training job's end either.
TINKER_CODES = {"worker_lost", "session_ended", "budget_exhausted"}
WORKER_CODES = sorted(set(CATALOG) - CONTROL_PLANE_CODES - DEPLOYMENT_CODES - TINKER_CODES)
