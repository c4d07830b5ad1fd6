"""`/healthz`: whether this process can reach what it needs. 200 when all is well, else 503."""

from django.conf import settings
from django.db import connection
from django.http import HttpRequest, JsonResponse
from django_q.brokers import get_broker

from providers.local import isolation
from veri.services import deployment_id
from volumes.stores import get_store


def _database() -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")


def _broker() -> None:
    if not get_broker().ping():
        raise ConnectionError("the task broker did not answer")


def _store() -> None:
    get_store().head("healthz")  # a missing object is fine: the store answered


CHECKS = {"database": _database, "broker": _broker, "store": _store}


def healthz(request: HttpRequest) -> JsonResponse:
    answer = {"deployment": deployment_id()}
    if "local" in settings.VERI_PROVIDER_ADAPTERS:
        answer["local_provider"] = {
            "isolation": isolation(),
            "tenants": "many" if isolation() == "sandbox" else "one",
        }
    for name, check in CHECKS.items():
        try:
            check()
            answer[name] = "ok"
        except Exception as exc:  # noqa: BLE001 - any failure is the answer, not a 500
            answer[name] = f"error: {type(exc).__name__}: {exc}"[:300]
    healthy = all(answer[name] == "ok" for name in CHECKS)
    return JsonResponse(answer, status=200 if healthy else 503)
