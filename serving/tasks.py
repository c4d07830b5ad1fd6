"""django-q2 tasks for serving: launching a replica's machine, and the minute schedule that
fails dead replicas, stops the deployments of workspaces out of money, scales loaded
deployments up and idle ones down to `min_replicas`, and charges running replicas; running an
evaluation, and the minute schedule queueing again the evaluations that lost their task.
Each is idempotent and safe to run twice or concurrently."""

from django.utils import timezone

from serving.services import evaluations, replicas, scaling


def launch_replica(*, replica_id: int) -> str:
    return replicas.launch_replica(replica_id=replica_id)


def watch_deployments() -> dict[str, int]:
    now = timezone.now()
    return {
        "failed": replicas.check_health(now=now),
        "unfunded": replicas.stop_unfunded(now=now),
        "scaled_up": scaling.scale_loaded(now=now),
        "scaled_down": replicas.scale_idle(now=now),
        "charged": replicas.charge_running(now=now),
    }


def run_evaluation(*, evaluation_id: int) -> str:
    return evaluations.run_evaluation(evaluation_id=evaluation_id)


def resume_evaluations() -> int:
    return evaluations.resume_stalled(now=timezone.now())
