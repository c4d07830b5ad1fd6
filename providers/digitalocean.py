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
from worker.serve_vllm import PORTS

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


def serving_tag() -> str:
    """The tag of this deployment's replicas' droplets, which its serving firewall applies to."""
    return f"veri-serving:{deployment_id()}"


def serving_firewall() -> dict:
    """This deployment's cloud firewall for replicas: the serving ports open to
    VERI_SERVING_ALLOWED_CIDR, and every outbound connection (a droplet under a cloud firewall
    may reach only what its outbound rules allow: the control plane, the package index, the
    model hub). A job's droplet has no firewall: it needs no inbound port."""
    anywhere = {"addresses": ["0.0.0.0/0", "::/0"]}
    return {
        "name": f"veri-serving-{deployment_id()}",
        "inbound_rules": [
            {
                "protocol": "tcp",
                "ports": f"{PORTS.start}-{PORTS.stop - 1}",
                "sources": {"addresses": [settings.VERI_SERVING_ALLOWED_CIDR]},
            }
        ],
        # Ports "0": all of them (firewalls/models/firewall_rule.yml, `ports`).
        "outbound_rules": [
            {"protocol": "tcp", "ports": "0", "destinations": anywhere},
            {"protocol": "udp", "ports": "0", "destinations": anywhere},
        ],
        "tags": [serving_tag()],
    }


def size_for(gpu_type: str, gpu_count: int) -> str | None:
    sizes = SIZES.get(gpu_type, {})
    return next((sizes[n] for n in sorted(sizes) if n >= gpu_count), None)


class DigitalOceanProvider(ProviderAdapter):
    name = "digitalocean"
    serves_replicas = True
    serving_ports = PORTS

    def api(self) -> RestClient:
        return RestClient("DigitalOcean", settings.VERI_DIGITALOCEAN_API_URL, self.token())

    @staticmethod
    def token() -> str:
        return settings.DIGITALOCEAN_TOKEN

    def is_configured(self) -> bool:
        return bool(self.token())

    def gpus_per_machine(self, gpu_type: str) -> int | None:
        return min(SIZES.get(gpu_type, {}), default=None)

    def launch(self, spec: LaunchSpec) -> str:
        size = size_for(spec.gpu_type, spec.gpu_count)
        if size is None:
            raise CapacityError(
                f"DigitalOcean has no droplet with {spec.gpu_count}x {spec.gpu_type}"
            )
        launch_tag = LAUNCH_TAG_PREFIX + secrets.token_hex(8)
        tags = [JOB_TAG_PREFIX + spec.job_id, deployment_tag(), launch_tag]
        if spec.kind == "replicas":
            self.open_serving_ports()
            tags.append(serving_tag())
        body = {
            "name": f"veri-{spec.job_id}".replace("_", "-"),
            "region": spec.zone,
            "size": size,
            "image": IMAGES[size],
            "user_data": bootstrap.render(spec),
            "tags": tags,
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

    def open_serving_ports(self) -> None:
        """Create this deployment's serving firewall, or bring it to the settings (PUT replaces
        it whole, so a changed VERI_SERVING_ALLOWED_CIDR replaces the old one)."""
        wanted = serving_firewall()
        try:
            found = self.api().request("GET", "/v2/firewalls", params={"per_page": 200})
            mine = [f for f in found.get("firewalls", []) if f.get("name") == wanted["name"]]
            if mine:
                self.api().request("PUT", f"/v2/firewalls/{mine[0]['id']}", json=wanted)
            else:
                self.api().request("POST", "/v2/firewalls", json=wanted)
        except ProviderApiError as exc:
            message = exc.body.get("message", "") if isinstance(exc.body, dict) else str(exc.body)
            raise ProviderError(
                f"DigitalOcean refused the serving firewall (HTTP {exc.status}): {message}"
            ) from exc

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
        kind = "private" if settings.VERI_SERVING_PRIVATE_NETWORK else "public"
        found = {}
        for droplet in self._droplets():
            address = next(
                (
                    n.get("ip_address")
                    for n in droplet.get("networks", {}).get("v4", [])
                    if n.get("type") == kind
                ),
                None,
            )
            found[str(droplet["id"])] = InstanceState(
                alive=droplet["status"] in RUNNING, address=address
            )
        return {i: found.get(i, InstanceState(alive=False)) for i in instance_ids}

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
