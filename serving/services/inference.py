"""The inference router: a request for `model` goes to the ready replica with the fewest
requests in flight of the workspace's deployment serving it, its answer streamed through as it
comes (never buffered). A model with no ready replica is woken and the request told to retry
(503, `Retry-After`), after waiting up to VERI_SERVING_WAIT_SECONDS for it. A workspace whose
balance is spent gets 402 and wakes nothing."""

import contextlib
import json
import time
from collections.abc import Iterator

import httpx
from django.conf import settings
from django.http import HttpResponse, StreamingHttpResponse
from django.utils import timezone

from serving import hooks, selectors
from serving.models import Deployment, DeploymentStatus, InflightRequest
from serving.services import replicas, scaling, states
from veri.errors import NotFound, ServiceUnavailable, VeriError
from veri.models import Workspace
from veri.tls import tls_context

POLL_SECONDS = 0.25
CUT_OFF = {
    "error": {
        "message": "The model's replica stopped while answering; retry the request.",
        "type": "server_error",
        "param": None,
        "code": "replica_failed",
    }
}


class ModelStarting(ServiceUnavailable):
    code = "model_starting"
    retry_after_seconds = 5


def route(*, workspace: Workspace, model: str) -> InflightRequest:
    """The request held for `model`, assigned to a ready replica (`.replica`); the caller
    forwards it, which releases it."""
    deployment = selectors.serving(workspace=workspace, model=model)
    if deployment is None:
        raise NotFound(
            f"The model {model[:200]!r} is not deployed in this workspace "
            "(veri deploy MODEL starts serving it).",
            field="model",
            code="model_not_found",
        )
    if deployment.status == DeploymentStatus.FAILED:
        raise VeriError(
            f"Deployment {deployment.public_id} failed ({deployment.error_code}): "
            f"{deployment.error_message}",
            field="model",
            code="deployment_failed",
        )
    hooks.require_funds(workspace=workspace)
    held = scaling.hold(deployment=deployment)  # queued: it counts towards the load from here
    try:
        return _assign(held, deployment, model)
    except BaseException:
        scaling.release(held=held)
        raise


def _assign(held: InflightRequest, deployment: Deployment, model: str) -> InflightRequest:
    deadline = time.monotonic() + settings.VERI_SERVING_WAIT_SECONDS
    woken = False
    while True:
        replica = scaling.least_loaded(deployment=deployment)
        if replica is not None:
            scaling.assign(held=held, replica=replica)
            _active(deployment)
            scaling.scale_up(deployment_id=deployment.pk, now=timezone.now())
            return held
        if not woken:
            replicas.start_replica(deployment=deployment)  # scale from zero (or the one starting)
            woken = True
        if time.monotonic() >= deadline:
            raise ModelStarting(
                f"The model {model[:200]!r} is starting (deployment {deployment.public_id}); "
                "retry after the Retry-After seconds.",
                field="model",
            )
        time.sleep(POLL_SECONDS)


def _active(deployment: Deployment) -> None:
    """The deployment is in use now: its idle timeout counts from here."""
    Deployment.objects.filter(pk=deployment.pk).update(last_active_at=timezone.now())


def forward(*, held: InflightRequest, path: str, body: bytes) -> HttpResponse:
    """POST `body` to the held request's replica's `path`, answering with its status and bytes
    as they come; the request is released when its answer ends (or its client goes). A replica
    that cannot be reached is failed (the next request starts another) and the request told to
    retry."""
    replica = held.replica
    client = httpx.Client(
        timeout=httpx.Timeout(settings.VERI_SERVING_READ_TIMEOUT_SECONDS, connect=5),
        verify=tls_context(),
    )
    request = client.build_request(
        "POST",
        f"{replica.url.rstrip('/')}{path}",
        content=body,
        headers={
            "Content-Type": "application/json",
            "Authorization": f"Bearer {replicas.serving_key(replica=replica)}",
        },
    )
    try:
        upstream = client.send(request, stream=True)
    except httpx.TransportError as exc:
        client.close()
        scaling.release(held=held)
        replicas.fail_replica(replica=replica, code="replica_failed", message=f"unreachable: {exc}")
        with contextlib.suppress(states.InvalidTransition):  # failed meanwhile: retries say so
            replicas.start_replica(deployment=replica.deployment)
        raise ModelStarting(
            "The model's replica stopped answering; a new one is starting. Retry after the "
            "Retry-After seconds.",
            field="model",
        ) from exc

    streaming = upstream.headers.get("content-type", "").startswith("text/event-stream")

    def chunks() -> Iterator[bytes]:
        tail, whole = b"", True
        renewed = time.monotonic()
        try:
            try:
                for chunk in upstream.iter_raw():
                    tail = (tail + chunk)[-512:]
                    yield chunk
                    if time.monotonic() - renewed > scaling.lease().total_seconds() / 2:
                        scaling.renew(held=held)  # a long stream still counts
                        renewed = time.monotonic()
            except httpx.TransportError:
                whole = False
            # A stream ends with `[DONE]` or the server's own error event; one that stopped short
            # (the replica died: its connection closing looks like an end) gets an error event,
            # which the openai client raises; any other answer just ends short. Never a hang.
            if streaming:
                whole = whole and (b"[DONE]" in tail or b'"error"' in tail)
            if not whole:
                replicas.fail_replica(replica=replica, code="replica_failed", message="cut off")
                if streaming:
                    yield f"data: {json.dumps(CUT_OFF)}\n\n".encode()
        finally:  # also when the client went away mid-answer
            upstream.close()
            client.close()
            scaling.release(held=held)
            _active(replica.deployment)

    response = StreamingHttpResponse(
        chunks(),
        status=upstream.status_code,
        content_type=upstream.headers.get("content-type", "application/json"),
    )
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"  # a proxy in front must not buffer the stream
    return response
