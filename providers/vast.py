"""Vast.ai through its REST API (v0): search the marketplace for an on-demand offer of the shape in
the zone's countries, accept it (a new instance running the worker's bootstrap on start), and
label the instance with this deployment and the job. VAST_API_KEY authenticates;
VERI_VAST_API_URL points it elsewhere."""

import re
import secrets

from django.conf import settings

from providers import bootstrap, catalog
from providers.base import (
    CapacityError,
    FundsError,
    InstanceState,
    LaunchSpec,
    ProviderAdapter,
    ProviderError,
)
from providers.http import ProviderApiError, RestClient
from veri.services import deployment_id

GPU_NAMES = {"RTX4090-24GB": "RTX 4090", "A100-80GB": "A100 SXM4", "H100-80GB": "H100 SXM"}
# The countries (the end of an offer's `geolocation`, e.g. "Oregon, US") of each catalog zone.
ZONE_COUNTRIES = {
    "vast-us": {"US", "CA"},
    "vast-eu": {"DE", "FR", "NL", "SE", "NO", "FI", "PL", "ES", "IT", "CZ", "GB", "IE", "BE"},
}
# An instance's `actual_status` (vast-ai/vast-cli, vastai/SKILL.md, "Instance status values"):
# null (provisioning), created, loading, running, stopped ("disk charges only"), frozen, exited,
# rebooting, unknown, offline; vast.py reads a destroyed one as "destroyed". "Storage charges
# begin at creation" and a stopped instance keeps paying for its disk until it is destroyed
# (SKILL.md, "Interruptible (spot) rentals"; `vastai destroy instance` "stops all billing"),
# and a container cannot end its own rental. So the sweeper destroys an instance in any
# status but "destroyed"; only these run no worker:
STOPPED = {"exited", "offline", "stopped", "destroyed"}
DESTROYED = "destroyed"
OFFERS_TRIED = 3  # an offer taken by someone else between search and accept: try the next


def label(job_id: str, launch: str = "") -> str:
    """`veri:<deployment>:<job>:<launch>`: the launch part names one accept request, so that a
    retried accept adopts the instance it made rather than one of an earlier attempt."""
    return f"veri:{deployment_id()}:{job_id}" + (f":{launch}" if launch else "")


def job_of(instance_label: str | None) -> str | None:
    """The job id in one of this deployment's labels, else None."""
    prefix = f"veri:{deployment_id()}:"
    if not (instance_label or "").startswith(prefix):
        return None
    return instance_label.removeprefix(prefix).partition(":")[0]


# An offer someone else rented between our search and our accept (Vast answers `no_such_ask`,
# with 400, 404 or 410): the next offer may still be free. Any other refusal of an accept is not
# about capacity.
OFFER_GONE = re.compile(r"no_such_ask|no longer available|not available|already rented", re.I)


def _error(exc: ProviderApiError) -> str:
    """Vast's own words: `{"success": false, "error": code, "msg": text}` (some answers carry
    only `msg` or `message`)."""
    body = exc.body if isinstance(exc.body, dict) else {}
    text = body.get("msg") or body.get("message") or ""
    return f"{body.get('error', '')} {text}".strip() or str(exc)


class VastProvider(ProviderAdapter):
    name = "vast"

    def api(self) -> RestClient:
        return RestClient("Vast.ai", settings.VERI_VAST_API_URL, settings.VAST_API_KEY)

    def is_configured(self) -> bool:
        return bool(settings.VAST_API_KEY)

    def offers(self, gpu_type: str, gpu_count: int, countries: set[str] | None) -> list[dict]:
        query = {
            "gpu_name": {"eq": GPU_NAMES.get(gpu_type, gpu_type)},
            "num_gpus": {"eq": gpu_count},
            "rentable": {"eq": True},
            "verified": {"eq": True},
            # Only offers with room for the disk the accept asks for, as the official CLI's
            # `launch instance` adds `disk_space>={disk}` to its search (vast-cli, vast.py).
            "disk_space": {"gte": settings.VERI_VAST_DISK_GB},
            "type": "on-demand",
            "order": [["dph_total", "asc"]],
            "limit": 64,
        }
        offers = self.api().request("POST", "/api/v0/bundles/", json=query).get("offers", [])
        if countries is None:
            return offers
        return [
            o
            for o in offers
            if (o.get("geolocation") or "").rsplit(",", 1)[-1].strip() in countries
        ]

    def launch(self, spec: LaunchSpec) -> str:
        offers = self.offers(spec.gpu_type, spec.gpu_count, ZONE_COUNTRIES.get(spec.zone, set()))
        if not offers:
            raise CapacityError(f"no {spec.gpu_count}x {spec.gpu_type} offer in {spec.zone}")
        body = {
            "client_id": "me",
            "image": settings.VERI_VAST_IMAGE,
            "disk": settings.VERI_VAST_DISK_GB,
            "runtype": "ssh",
            "onstart": bootstrap.render(spec),
        }
        refusals = []
        for offer in offers[:OFFERS_TRIED]:
            mine = label(spec.job_id, secrets.token_hex(8))

            def adopt(mine=mine) -> dict | None:
                """The instance this accept made, when only its answer was lost."""
                found = [i for i in self._instances() if i.get("label") == mine]
                return {"success": True, "new_contract": found[0]["id"]} if found else None

            try:
                answer = self.api().request(
                    "PUT",
                    f"/api/v0/asks/{offer['id']}/",
                    json={**body, "label": mine},
                    adopt=adopt,
                )
            except ProviderApiError as exc:
                reason = _error(exc)
                if "credit" in reason.lower() or exc.status == 402:
                    raise FundsError(reason) from exc
                if exc.status in (401, 403) or not OFFER_GONE.search(reason):
                    raise ProviderError(
                        f"Vast.ai refused the rental (HTTP {exc.status}): {reason}"
                    ) from exc
                refusals.append(reason)  # taken meanwhile, or no longer rentable
                continue
            if answer.get("success") and answer.get("new_contract"):
                return str(answer["new_contract"])
            refusals.append(str(answer)[:200])
        raise CapacityError(f"{spec.zone}: every offer tried was refused ({'; '.join(refusals)})")

    def _instances(self) -> list[dict]:
        return self.api().request("GET", "/api/v0/instances/").get("instances", [])

    def states(self, instance_ids: list[str]) -> dict[str, InstanceState]:
        status = {str(i["id"]): i.get("actual_status") for i in self._instances()}
        return {
            i: InstanceState(alive=i in status and status[i] not in STOPPED) for i in instance_ids
        }

    def terminate(self, instance_id: str) -> None:
        self.api().delete(f"/api/v0/instances/{int(instance_id)}/")

    def tagged_instances(self) -> dict[str, str]:
        return {
            str(i["id"]): job
            for i in self._instances()
            if (job := job_of(i.get("label"))) is not None and i.get("actual_status") != DESTROYED
        }

    def available_regions(self, gpu_type: str) -> list[str] | None:
        try:
            offers = self.offers(gpu_type, 1, None)
        except ProviderError:
            return None
        countries = {(o.get("geolocation") or "").rsplit(",", 1)[-1].strip() for o in offers}
        zones = catalog.get_provider(self.name).zones
        return [
            region
            for region, names in zones.items()
            if any(ZONE_COUNTRIES.get(z, set()) & countries for z in names)
        ]
