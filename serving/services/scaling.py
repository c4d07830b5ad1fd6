"""Load: the requests the router holds (queued, or forwarded to a replica), the ready replica
with the fewest of them, and scaling up when a deployment's in-flight requests per ready
replica stay over VERI_SERVING_TARGET_INFLIGHT for VERI_SERVING_SCALE_WINDOW_SECONDS (down is
the idle timeout's, in `replicas.scale_idle`).

Each held request is a row (`InflightRequest`): every web process counts the others', and a
process that crashed mid-request leaves rows that stop counting when their lease ends (a
stream renews it as it passes chunks). The cache would not do here: it is per process unless
Redis is configured, which the embedded default does not need."""

from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Count, F, Q, QuerySet
from django.utils import timezone

from serving.models import Deployment, DeploymentStatus, InflightRequest, Replica, ReplicaStatus
from serving.services import replicas

S, R = DeploymentStatus, ReplicaStatus


def lease() -> timedelta:
    """How long a held request counts without news: a whole answer may take the read timeout
    between two chunks."""
    return timedelta(seconds=settings.VERI_SERVING_READ_TIMEOUT_SECONDS + 60)


def hold(*, deployment: Deployment) -> InflightRequest:
    """A request for the deployment, queued until a replica is chosen for it."""
    return InflightRequest.objects.create(
        deployment=deployment, expires_at=timezone.now() + lease()
    )


def assign(*, held: InflightRequest, replica: Replica) -> None:
    held.replica = replica
    InflightRequest.objects.filter(pk=held.pk).update(replica=replica)
    Replica.objects.filter(pk=replica.pk).update(requests=F("requests") + 1)


def renew(*, held: InflightRequest) -> None:
    InflightRequest.objects.filter(pk=held.pk).update(expires_at=timezone.now() + lease())


def release(*, held: InflightRequest) -> None:
    InflightRequest.objects.filter(pk=held.pk).delete()


def counting(queryset: QuerySet[InflightRequest], now: datetime) -> QuerySet[InflightRequest]:
    return queryset.filter(expires_at__gt=now)


def least_loaded(*, deployment: Deployment) -> Replica | None:
    """The ready replica with the fewest requests in flight (then the fewest served)."""
    now = timezone.now()
    return (
        deployment.replicas.filter(status=R.READY)
        .exclude(url="")
        .annotate(load=Count("inflight", filter=Q(inflight__expires_at__gt=now)))
        .order_by("load", "requests", "pk")
        .first()
    )


def scale_up(*, deployment_id: int, now: datetime) -> bool:
    """One more replica (up to `max_replicas`, one starting at a time) once the in-flight
    requests per ready replica have stayed over the target for the window; the row is claimed
    with SKIP LOCKED, so concurrent requests and the task never both act on it."""
    with transaction.atomic():
        deployment = (
            Deployment.objects.select_for_update(skip_locked=True)
            .filter(pk=deployment_id, status=S.READY)
            .first()
        )
        if deployment is None:
            return False
        ready = deployment.replicas.filter(status=R.READY).count()
        inflight = counting(deployment.inflight, now).count()
        if inflight <= settings.VERI_SERVING_TARGET_INFLIGHT * ready:
            if deployment.loaded_since is not None:
                Deployment.objects.filter(pk=deployment.pk).update(loaded_since=None)
            return False
        if deployment.loaded_since is None:
            Deployment.objects.filter(pk=deployment.pk).update(loaded_since=now)
            deployment.loaded_since = now
        window = timedelta(seconds=settings.VERI_SERVING_SCALE_WINDOW_SECONDS)
        if (
            now - deployment.loaded_since < window
            or deployment.replicas.filter(status__in=[R.STARTING]).exists()
            or ready >= deployment.max_replicas
        ):
            return False
        replicas.start_replica(
            deployment=deployment, another={"inflight": inflight, "ready_replicas": ready}
        )
        # The next window starts once the new replica takes its share.
        Deployment.objects.filter(pk=deployment.pk).update(loaded_since=None)
        return True


def scale_loaded(*, now: datetime) -> int:
    """The minute task's pass: long answers keep a deployment loaded with no new request."""
    InflightRequest.objects.filter(expires_at__lte=now).delete()  # crashed processes' leftovers
    ready = Deployment.objects.filter(status=S.READY).values_list("pk", flat=True)
    return sum(scale_up(deployment_id=pk, now=now) for pk in ready)
