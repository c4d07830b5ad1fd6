"""A deployment's one state machine and its events."""

from django.db import transaction
from django.utils import timezone

from serving.models import Deployment, DeploymentEvent, DeploymentStatus
from training import errors
from veri.errors import Conflict

S = DeploymentStatus
NEXT = {  # `failed` has no entry: nothing leaves it (delete it, deploy again)
    S.PENDING: {S.STARTING, S.STOPPED, S.FAILED},
    S.STARTING: {S.READY, S.SCALING_DOWN, S.STOPPED, S.FAILED},
    # ready → starting: its replica was lost and a new one is on its way
    S.READY: {S.STARTING, S.SCALING_DOWN, S.STOPPED, S.FAILED},
    S.SCALING_DOWN: {S.STOPPED, S.FAILED},
    S.STOPPED: {S.STARTING},  # scaled to zero: the next request wakes it
}


class InvalidTransition(Conflict):
    code = "invalid_transition"


@transaction.atomic
def transition(
    *,
    deployment_id: int,
    to: DeploymentStatus,
    error_code: str | None = None,
    message: str = "",
    detail: dict | None = None,
) -> Deployment:
    """The one way a deployment changes status: row-locked, so concurrent tasks and requests
    serialize; the event is written in the same transaction; an illegal move changes nothing.
    `error_code` (a catalog code) says why it failed, or why it stopped (until it wakes)."""
    deployment = Deployment.objects.select_for_update().get(pk=deployment_id)
    if deployment.status == to:
        return deployment
    if to not in NEXT.get(deployment.status, ()):
        raise InvalidTransition(f"A {deployment.status} deployment cannot become {to}.")
    event = {"from": deployment.status, **(detail or {})}
    deployment.status = to
    if to == S.READY:
        deployment.last_active_at = timezone.now()  # idle from now, not from its last request
    if to == S.STARTING:  # woken: whatever stopped it (a spent balance) is over
        deployment.error_code = deployment.error_message = deployment.error_attribution = ""
    if error_code:  # failed, or stopped for a reason the catalog names
        entry = errors.get(error_code)
        deployment.error_code = entry.code
        deployment.error_message = message or f"{entry.cause}. {entry.hint}"
        deployment.error_attribution = errors.attribution_for(entry.code)
        event |= {
            "code": entry.code,
            "attribution": deployment.error_attribution,
            "message": deployment.error_message,
        }
    deployment.save()
    record_event(deployment=deployment, type=to, detail=event)
    return deployment


def record_event(*, deployment: Deployment, type: str, detail: dict) -> DeploymentEvent:
    return DeploymentEvent.objects.create(deployment=deployment, type=type, detail=detail)


def deployment_error(deployment: Deployment) -> dict | None:
    if not deployment.error_code:
        return None
    return {
        "code": deployment.error_code,
        "message": deployment.error_message,
        "attribution": deployment.error_attribution,
    }
