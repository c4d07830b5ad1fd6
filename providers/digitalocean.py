"""DigitalOcean GPU Droplets through DigitalOcean's REST API (v2): a droplet per job in the zone's
datacenter, tagged with the job and this deployment, booted with the worker's bootstrap as
user_data. DIGITALOCEAN_TOKEN authenticates; VERI_DIGITALOCEAN_API_URL points it elsewhere."""

import re
import secrets

from django.conf import settings

from providers import bootstrap, catalog
from providers.base import (
    CapacityError,
    InstanceState,
    LaunchSpec,
    ProviderAdapter,
    ProviderError,
    QuotaError,
)
from providers.http import ProviderApiError, RestClient
from veri.services import deployment_id

# Droplet sizes by GPU count; DigitalOcean's GPU images carry the drivers.
SIZES = {"H100-80GB": {1: "gpu-h100x1-80gb", 8: "gpu-h100x8-640gb"}}
IMAGES = {"gpu-h100x1-80gb": "gpu-h100x1-base", "gpu-h100x8-640gb": "gpu-h100x8-base"}
# A droplet's status is "new", "active", "off" or "archive" (digitalocean/openapi,
# specification/resources/droplets/models/droplet.yml, `status`). Only new and active ones run a
# worker; every status bills (a powered-off droplet keeps its reserved GPU, disk and IP and is
# charged until destroyed: https://docs.digitalocean.com/products/droplets/details/pricing/),
# and a destroyed droplet is no longer listed. So the sweeper deletes a droplet in any status.
RUNNING = {"new", "active"}
# DigitalOcean tags allow letters, digits, colons, dashes and underscores
# (specification/resources/tags/models/tags.yml, `name.pattern`: ^[a-zA-Z0-9_\-\:]+$).
JOB_TAG_PREFIX = "veri-job:"
# One tag per create request: a create retried after its answer was lost adopts the droplet
# this very request made (never one of an earlier attempt of the job).
LAUNCH_TAG_PREFIX = "veri-launch:"
# A 422 that is about capacity: the size (or the region) is not available there now.
CAPACITY = re.compile(r"(size|region).{0,40}(not available|unavailable)|capacity", re.I)


def deployment_tag() -> str:
    return f"veri-deployment:{deployment_id()}"


def size_for(gpu_type: str, gpu_count: int) -> str | None:
    sizes = SIZES.get(gpu_type, {})
    return next((sizes[n] for n in sorted(sizes) if n >= gpu_count), None)


class DigitalOceanProvider(ProviderAdapter):
    name = "digitalocean"

    def api(self) -> RestClient:
        return RestClient("DigitalOcean", settings.VERI_DIGITALOCEAN_API_URL, self.token())

    @staticmethod
    def token() -> str:
        return settings.DIGITALOCEAN_TOKEN

    def is_configured(self) -> bool:
        return bool(self.token())

    def launch(self, spec: LaunchSpec) -> str:
        size = size_for(spec.gpu_type, spec.gpu_count)
        if size is None:
            raise CapacityError(
                f"DigitalOcean has no droplet with {spec.gpu_count}x {spec.gpu_type}"
            )
        launch_tag = LAUNCH_TAG_PREFIX + secrets.token_hex(8)
        body = {
            "name": f"veri-{spec.job_id}".replace("_", "-"),
            "region": spec.zone,
            "size": size,
            "image": IMAGES[size],
            "user_data": bootstrap.render(spec),
            "tags": [JOB_TAG_PREFIX + spec.job_id, deployment_tag(), launch_tag],
            "monitoring": True,
        }

        def adopt() -> dict | None:
            """The droplet this create made, when only its answer was lost."""
            found = [d for d in self._droplets() if launch_tag in d.get("tags", [])]
            return {"droplet": found[0]} if found else None

        try:
            answer = self.api().request("POST", "/v2/droplets", json=body, adopt=adopt)
        except ProviderApiError as exc:
            message = exc.body.get("message", "") if isinstance(exc.body, dict) else str(exc.body)
            if exc.status == 422 and re.search(r"droplet limit|exceed", message, re.I):
                raise QuotaError(f"{size}: {message}") from exc
            if exc.status == 422 and CAPACITY.search(message):
                raise CapacityError(f"{size} in {spec.zone}: {message}") from exc
            # Anything else (a token refused, an image or parameter rejected) is configuration.
            raise ProviderError(
                f"DigitalOcean refused {size} in {spec.zone} (HTTP {exc.status}): "
                f"{message or exc.body}"
            ) from exc
        return str(answer["droplet"]["id"])

    def _droplets(self) -> list[dict]:
        """This deployment's droplets. The listing returns only non-GPU droplets unless
        `type=gpus`, which cannot be combined with `tag_name` (droplets_list.yml, "GPU
        Droplets"; parameters.yml, `droplet_type`): so GPU droplets, filtered by tag here."""
        droplets, page = [], 1
        while True:
            answer = self.api().request(
                "GET", "/v2/droplets", params={"type": "gpus", "per_page": 200, "page": page}
            )
            droplets += answer.get("droplets", [])
            if not answer.get("links", {}).get("pages", {}).get("next"):
                return [d for d in droplets if deployment_tag() in d.get("tags", [])]
            page += 1

    def states(self, instance_ids: list[str]) -> dict[str, InstanceState]:
        """A droplet that is off (the bootstrap's own `shutdown -h`, or powered off) runs no
        worker: not alive, although it still bills until the sweeper or settle deletes it."""
        status = {str(d["id"]): d["status"] for d in self._droplets()}
        return {i: InstanceState(alive=status.get(i) in RUNNING) for i in instance_ids}

    def terminate(self, instance_id: str) -> None:
        self.api().delete(f"/v2/droplets/{int(instance_id)}")

    def tagged_instances(self) -> dict[str, str]:
        """Every listed droplet of this deployment, whatever its status: each one bills."""
        found = {}
        for droplet in self._droplets():
            job = next(
                (
                    t.removeprefix(JOB_TAG_PREFIX)
                    for t in droplet.get("tags", [])
                    if t.startswith(JOB_TAG_PREFIX)
                ),
                "",
            )
            found[str(droplet["id"])] = job
        return found

    def available_regions(self, gpu_type: str) -> list[str] | None:
        size = size_for(gpu_type, 1)
        if size is None:
            return []
        try:
            sizes = self.api().request("GET", "/v2/sizes", params={"per_page": 200})["sizes"]
        except (ProviderApiError, KeyError):
            return None
        offered = next((s for s in sizes if s["slug"] == size and s.get("available")), None)
        if offered is None:
            return []
        zones = catalog.get_provider(self.name).zones
        return [region for region, dcs in zones.items() if set(dcs) & set(offered["regions"])]
