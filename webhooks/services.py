"""Endpoints (register, change, rotate, remove), publishing events into the outbox, and
delivering one: every state change of webhooks."""

import ipaddress
import json
import socket
import time
from datetime import datetime, timedelta
from urllib.parse import urlsplit

import httpx
from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import F
from django.utils import timezone

from veri.errors import VeriError
from veri.models import Workspace, make_public_id
from veri.queue import enqueue_on_commit
from veri.tls import tls_context
from webhooks import signing
from webhooks.models import WebhookAttempt, WebhookDelivery, WebhookEndpoint

# Standard Webhooks' schedule: the first attempt at once, then these waits between attempts
# (about 28 hours in all); after the last one fails the delivery is given up.
RETRY_DELAYS = [
    timedelta(seconds=5),
    timedelta(minutes=5),
    timedelta(minutes=30),
    timedelta(hours=2),
    timedelta(hours=5),
    timedelta(hours=10),
    timedelta(hours=10),
]
MAX_ATTEMPTS = len(RETRY_DELAYS) + 1
# A claimed attempt holds its delivery this long: past the request's timeout, so two tasks never
# post the same delivery at once, and short, so a task that died is retried soon.
CLAIM_SECONDS = 60
EXCERPT_CHARS = 1000
ROTATION_OVERLAP = timedelta(hours=24)
TEST_EVENT = "webhook.test"
# Every event the apps publish: an endpoint may subscribe to these only (a misspelt type would
# never fire), and publishing another is a bug.
EVENT_TYPES = (
    "training_job.completed",
    "training_job.failed",
    "training_job.cancelled",
    "fine_tuning.job.succeeded",
    "fine_tuning.job.failed",
    "fine_tuning.job.cancelled",
)


class BadWebhookUrl(VeriError):
    code = "invalid_webhook_url"


def _resolve(host: str) -> tuple[str | None, str]:
    """(the address of `host` to post to, or None and why not). With VERI_WEBHOOKS_ALLOW_PRIVATE
    off, every address the name resolves to must be public (not loopback, private, link-local,
    shared, reserved...). IPv4 first: the one address used must be reachable from here."""
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError):
        return None, f"{host} does not resolve."
    addresses = sorted({info[4][0] for info in infos}, key=lambda a: (":" in a, a))
    if not settings.VERI_WEBHOOKS_ALLOW_PRIVATE:
        for address in addresses:
            if not ipaddress.ip_address(address.split("%")[0]).is_global:
                return None, f"{host} resolves to {address}, which is not a public address."
    return addresses[0], ""


def validate_url(url: str) -> str:
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - a port that is not a number raises here
    except ValueError:
        parts = None
    if parts is None or parts.scheme not in {"http", "https"} or not parts.hostname:
        raise BadWebhookUrl("A webhook URL must be an http:// or https:// URL.", field="url")
    if parts.username or parts.password:
        raise BadWebhookUrl("A webhook URL may not carry a user name or password.", field="url")
    if not settings.VERI_WEBHOOKS_ALLOW_PRIVATE:
        address, why = _resolve(parts.hostname)
        if address is None:
            raise BadWebhookUrl(f"Deliveries cannot go there: {why}", field="url")
    return url


def _validate_event_types(event_types: list[str]) -> list[str]:
    for given in event_types:
        if given not in EVENT_TYPES:
            raise VeriError(
                f"Unknown event type {str(given)[:100]!r}; the types are: "
                f"{', '.join(EVENT_TYPES)}.",
                field="event_types",
                code="unknown_event_type",
            )
    return sorted(set(event_types))


@transaction.atomic
def create_endpoint(
    *, workspace: Workspace, url: str, event_types: list[str] | None = None, description: str = ""
) -> tuple[WebhookEndpoint, str]:
    """A new endpoint and its signing secret, which is answered here and never again."""
    secret = signing.new_secret()
    endpoint = WebhookEndpoint(
        workspace=workspace,
        url=validate_url(url),
        description=description,
        event_types=_validate_event_types(event_types or []),
        secret_sealed=signing.seal(secret),
        secret_hint=signing.hint(secret),
    )
    endpoint.full_clean()
    endpoint.save()
    return endpoint, secret


@transaction.atomic
def update_endpoint(
    *,
    endpoint: WebhookEndpoint,
    url: str | None = None,
    event_types: list[str] | None = None,
    description: str | None = None,
    enabled: bool | None = None,
) -> WebhookEndpoint:
    """Changes what is given; deliveries already owed keep going to the endpoint."""
    if url is not None:
        endpoint.url = validate_url(url)
    if event_types is not None:
        endpoint.event_types = _validate_event_types(event_types)
    if description is not None:
        endpoint.description = description
    if enabled is not None:
        endpoint.enabled = enabled
    endpoint.full_clean()
    endpoint.save()
    return endpoint


@transaction.atomic
def rotate_secret(
    *, endpoint: WebhookEndpoint, keep_old_for_24_hours: bool = False
) -> tuple[WebhookEndpoint, str]:
    """A new signing secret, answered once. Kept, the old one signs alongside it for a day, so
    receivers can switch without dropping a delivery."""
    endpoint = WebhookEndpoint.objects.select_for_update().get(pk=endpoint.pk)
    secret = signing.new_secret()
    if keep_old_for_24_hours:
        endpoint.previous_secret_sealed = endpoint.secret_sealed
        endpoint.previous_secret_expires_at = timezone.now() + ROTATION_OVERLAP
    else:
        endpoint.previous_secret_sealed, endpoint.previous_secret_expires_at = "", None
    endpoint.secret_sealed, endpoint.secret_hint = signing.seal(secret), signing.hint(secret)
    endpoint.save()
    return endpoint, secret


def delete_endpoint(*, endpoint: WebhookEndpoint) -> None:
    """Its deliveries and their log go with it; a delivery task already queued finds nothing."""
    endpoint.delete()


def _envelope(event_type: str, data: dict) -> tuple[str, str]:
    """(event id, the envelope's JSON) exactly as OpenAI sends its webhooks."""
    event_id = make_public_id("evt")
    envelope = {
        "id": event_id,
        "object": "event",
        "created_at": int(time.time()),
        "type": event_type,
        "data": data,
    }
    return event_id, json.dumps(envelope, separators=(",", ":"))


def _queue(endpoints: list[WebhookEndpoint], event_type: str, data: dict) -> list[WebhookDelivery]:
    event_id, payload = _envelope(event_type, data)
    now = timezone.now()
    deliveries = WebhookDelivery.objects.bulk_create(
        WebhookDelivery(
            endpoint=endpoint,
            event_id=event_id,
            event_type=event_type,
            payload=payload,
            next_attempt_at=now,
        )
        for endpoint in endpoints
    )
    for delivery in deliveries:
        enqueue_on_commit("webhooks.tasks.deliver", delivery_id=delivery.pk)
    return deliveries


def publish(*, workspace: Workspace, event_type: str, data: dict) -> None:
    """Owe `event_type` to every enabled endpoint of the workspace that takes it: rows written in
    the caller's transaction (so an event exists exactly when the change it reports commits),
    delivered by tasks queued once it commits. No network here; one query when the workspace has
    no endpoint."""
    if event_type not in EVENT_TYPES:
        raise ValueError(f"{event_type!r} is not in webhooks.services.EVENT_TYPES")
    endpoints = [
        e
        for e in WebhookEndpoint.objects.filter(workspace=workspace, enabled=True).only(
            "pk", "enabled", "event_types"
        )
        if e.receives(event_type)
    ]
    if endpoints:
        _queue(endpoints, event_type, data)


def send_test(*, endpoint: WebhookEndpoint) -> WebhookDelivery:
    """A `webhook.test` event to this endpoint alone, whatever event types it takes."""
    with transaction.atomic():
        [delivery] = _queue(
            [endpoint], TEST_EVENT, {"id": endpoint.public_id, "object": "webhook_endpoint"}
        )
    return delivery


def _claim(delivery_id: int) -> WebhookDelivery | None:
    """The delivery, if it is due and this caller won it: one conditional UPDATE, so a task run
    twice, or the sweep and a task at once, post it once."""
    now = timezone.now()
    won = WebhookDelivery.objects.filter(
        pk=delivery_id, delivered_at=None, failed_at=None, next_attempt_at__lte=now
    ).update(
        next_attempt_at=now + timedelta(seconds=CLAIM_SECONDS), attempt_count=F("attempt_count") + 1
    )
    if not won:
        return None
    return WebhookDelivery.objects.select_related("endpoint").get(pk=delivery_id)


def _signing_secrets(endpoint: WebhookEndpoint, now: datetime) -> list[str]:
    sealed = [endpoint.secret_sealed]
    if endpoint.previous_secret_sealed and endpoint.previous_secret_expires_at > now:
        sealed.append(endpoint.previous_secret_sealed)
    return [signing.unseal(s) for s in sealed]


def _post(delivery: WebhookDelivery) -> tuple[int | None, str, str]:
    """(status code or None, error, the answer's first characters). Redirects are not followed:
    a 3xx is an answer like any other that is not 2xx."""
    endpoint, now = delivery.endpoint, timezone.now()
    url = urlsplit(endpoint.url)
    address, why = _resolve(url.hostname or "")
    if address is None:
        return None, f"Not sent: {why}", ""
    # Connect to the address just checked, not to what a second lookup answers (a name that
    # resolves to a public address for the check and a private one for the request); the name
    # still goes in Host, and in TLS's SNI and certificate check.
    port = url.port or (443 if url.scheme == "https" else 80)
    pinned = url._replace(netloc=f"[{address}]:{port}" if ":" in address else f"{address}:{port}")
    headers = signing.signed_headers(
        message_id=delivery.event_id,
        body=delivery.payload,
        at=now,
        secrets_=_signing_secrets(endpoint, now),
    )
    headers |= {
        "host": url.netloc,
        "content-type": "application/json",
        "user-agent": "Veri-Webhooks/1",
    }
    timeout = settings.VERI_WEBHOOKS_TIMEOUT_SECONDS
    try:
        with (
            httpx.Client(
                timeout=timeout, trust_env=False, verify=tls_context(trust_env=False)
            ) as client,
            client.stream(
                "POST",
                pinned.geturl(),
                content=delivery.payload.encode(),
                headers=headers,
                extensions={"sni_hostname": url.hostname},
            ) as response,
        ):
            excerpt = b""
            for chunk in response.iter_bytes():  # only the first bytes: the rest is not read
                excerpt += chunk
                if len(excerpt) >= EXCERPT_CHARS:
                    break
            text = excerpt[:EXCERPT_CHARS].decode("utf-8", "replace")
            return response.status_code, "", text
    except httpx.HTTPError as exc:
        return None, f"{type(exc).__name__}: {exc}"[:EXCERPT_CHARS], ""


def attempt_delivery(*, delivery_id: int) -> WebhookDelivery | None:
    """One attempt at a due delivery, logged: a 2xx delivers it; anything else schedules the next
    attempt per `RETRY_DELAYS`, or gives up after the last. Not due, already claimed, delivered,
    given up or deleted: nothing happens (None)."""
    delivery = _claim(delivery_id)
    if delivery is None:
        return None
    started = timezone.now()
    clock = time.monotonic()
    status_code, error, excerpt = _post(delivery)
    duration_ms = int((time.monotonic() - clock) * 1000)
    if status_code is not None and not 200 <= status_code < 300:
        error = f"HTTP {status_code}"
    now = timezone.now()
    changes = {"last_status_code": status_code, "last_error": error}
    if not error:
        changes["delivered_at"] = now
    elif delivery.attempt_count >= MAX_ATTEMPTS:
        changes["failed_at"] = now
    else:
        changes["next_attempt_at"] = now + RETRY_DELAYS[delivery.attempt_count - 1]
    try:
        with transaction.atomic():
            WebhookAttempt.objects.create(
                delivery=delivery,
                started_at=started,
                duration_ms=duration_ms,
                status_code=status_code,
                error=error,
                response_excerpt=excerpt,
            )
            WebhookDelivery.objects.filter(pk=delivery.pk).update(**changes)
    except IntegrityError:  # the endpoint was deleted during the attempt: nothing left to log
        return None
    for name, value in changes.items():
        setattr(delivery, name, value)
    return delivery
