"""DigitalOcean's and Vast.ai's REST APIs, faked over HTTP on loopback from their public API
documents: each request's method, path, bearer token and body are checked against the documented
shape (a wrong one answers 400 and is kept in `bad`), and the state they change is kept."""

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

from tests.conftest import serve_in_background

TOKEN = "test-provider-token"
DROP = object()  # a route's answer: close the connection without answering


class LostAnswers:
    """Creates that succeed and whose answer is then lost: `lose("drop")` closes the connection
    without an answer, `lose(502)` answers a bad gateway; one per create, in order."""

    def __init__(self):
        self.pending: list[str | int] = []

    def lose(self, *how: str | int) -> None:
        self.pending += how

    def answer(self, status: int, answer):
        if not self.pending:
            return status, answer
        how = self.pending.pop(0)
        if how == "drop":
            return DROP
        return how, {"id": "bad_gateway", "message": "upstream answer lost"}


class FakeApi:
    token: str | None = TOKEN  # the bearer token every request must carry (None: not checked)
    # The provider's answer to a request without that token.
    unauthorized: tuple[int, dict] = (401, {"id": "unauthorized", "message": "bad token"})

    def __init__(self):
        self.requests: list[tuple[str, str, dict | None]] = []  # (method, path, body)
        self.bad: list[str] = []  # requests whose shape broke the documents
        self.lock = threading.Lock()
        self.next_id = 1000
        self.throttle = 0  # answer this many next requests with 429, Retry-After: 0
        self.lost = LostAnswers()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def _handle(self):
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                body = json.loads(raw) if raw else None
                url = urlparse(self.path)
                with fake.lock:
                    fake.requests.append((self.command, url.path, body))
                    if fake.throttle > 0:
                        fake.throttle -= 1
                        self._send(429, {"id": "too_many_requests"}, {"Retry-After": "0"})
                        return
                if fake.token and self.headers.get("Authorization") != f"Bearer {fake.token}":
                    self._send(*fake.unauthorized)
                    return
                query = {k: v[0] for k, v in parse_qs(url.query).items()}
                with fake.lock:
                    result = fake.route(self.command, url.path, query, body)
                if result is DROP:
                    self.close_connection = True  # the client sees the connection drop
                    return
                self._send(*result)

            do_GET = do_POST = do_PUT = do_DELETE = _handle

            def _send(self, status, answer, headers=None):
                payload = b"" if answer is None else json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                for name, value in (headers or {}).items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        serve_in_background(self.server)

    def new_id(self) -> int:
        self.next_id += 1
        return self.next_id

    def refuse_shape(self, why: str):
        self.bad.append(why)
        return 400, {"id": "bad_request", "message": why}

    def calls(self, method: str, pattern: str) -> list[dict | None]:
        return [b for m, p, b in self.requests if m == method and re.fullmatch(pattern, p)]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class FakeDigitalOcean(FakeApi):
    """https://docs.digitalocean.com/reference/api/digitalocean/: droplets and sizes. Each rule
    cites its line of DigitalOcean's OpenAPI specification (github.com/digitalocean/openapi,
    `specification/resources/...`, abbreviated `spec:` below)."""

    SIZES = [
        {"slug": "gpu-h100x1-80gb", "available": True, "regions": ["nyc2", "tor1"]},
        {"slug": "gpu-h100x8-640gb", "available": True, "regions": ["nyc2"]},
    ]
    # What DigitalOcean answers a token it does not know (or a revoked one).
    unauthorized = (401, {"id": "Unauthorized", "message": "Unable to authenticate you"})

    def __init__(self):
        self.droplets: dict[int, dict] = {}
        self.firewalls: dict[str, dict] = {}
        # droplet id -> its public IPv4 address (a loopback alias stands in for one)
        self.addresses: dict[int, str] = {}
        # region -> the answer to a create there: a 422 message, or (status, id, message)
        self.refusals: dict[str, str | tuple[int, str, str]] = {}
        super().__init__()

    def networks(self, droplet_id: int) -> list[dict]:
        private = {"ip_address": f"10.10.0.{droplet_id % 250}", "type": "private"}
        public = self.addresses.get(droplet_id, f"203.0.113.{droplet_id % 250}")
        return [{"ip_address": public, "type": "public"}, private]

    def route(self, method, path, query, body):
        if method == "POST" and path == "/v2/droplets":
            return self.create(body)
        if method == "GET" and path == "/v2/droplets":
            return self.list(query)
        if method == "GET" and path == "/v2/firewalls":
            found = list(self.firewalls.values())
            return 200, {"firewalls": found, "links": {}, "meta": {"total": len(found)}}
        if method == "POST" and path == "/v2/firewalls":
            return self.firewall(str(self.new_id()), body, 202)
        if method == "PUT" and (match := re.fullmatch(r"/v2/firewalls/([^/]+)", path)):
            if match.group(1) not in self.firewalls:
                return 404, {"id": "not_found", "message": "no such firewall"}
            return self.firewall(match.group(1), body, 200)
        if method == "GET" and path == "/v2/sizes":
            return 200, {"sizes": self.SIZES, "links": {}, "meta": {"total": len(self.SIZES)}}
        if match := re.fullmatch(r"/v2/droplets/(\d+)", path):
            droplet_id = int(match.group(1))
            if droplet_id not in self.droplets:
                return 404, {
                    "id": "not_found",
                    "message": "The resource you requested could not be found.",
                }
            if method == "DELETE":
                del self.droplets[droplet_id]
                return 204, None
            return 200, {"droplet": self.droplets[droplet_id]}
        return 404, {"id": "not_found", "message": f"no route {method} {path}"}

    def firewall(self, firewall_id: str, body, status: int):
        """spec: firewalls/models/firewall.yml: `name` (^[a-zA-Z0-9][a-zA-Z0-9.-]+$), rules of
        firewall_rule.yml (`protocol` tcp, udp or icmp; `ports` a port, a range or "0" for all;
        `sources` / `destinations` with `addresses`), and `tags` it applies to."""
        if not re.fullmatch(r"[a-zA-Z0-9][a-zA-Z0-9.-]+", (body or {}).get("name", "")):
            return self.refuse_shape("name: letters, digits, dots and dashes")
        for side, target in (("inbound_rules", "sources"), ("outbound_rules", "destinations")):
            for rule in body.get(side, []):
                if rule.get("protocol") not in ("tcp", "udp", "icmp"):
                    return self.refuse_shape(f"{side}: protocol tcp, udp or icmp")
                if not re.fullmatch(r"\d+(-\d+)?", rule.get("ports", "")):
                    return self.refuse_shape(f"{side}: ports a port, a range or 0")
                if not isinstance(rule.get(target, {}).get("addresses"), list):
                    return self.refuse_shape(f"{side}: {target}.addresses")
        self.firewalls[firewall_id] = {"id": firewall_id, "status": "succeeded", **body}
        return status, {"firewall": self.firewalls[firewall_id]}

    def list(self, query):
        tag, kind = query.get("tag_name"), query.get("type")
        # spec: droplets/parameters.yml `droplet_tag_name`: "Can not be combined with `name` or
        # `type`"; `droplet_type`: enum droplets | gpus.
        if tag is not None and (kind is not None or "name" in query):
            return self.refuse_shape("tag_name can not be combined with name or type")
        if kind not in (None, "droplets", "gpus"):
            return self.refuse_shape("type: droplets or gpus")
        # spec: droplets/droplets_list.yml, "GPU Droplets": "By default, only non-GPU Droplets
        # are returned. To list only GPU Droplets, set the `type` query parameter to `gpus`."
        gpus = kind == "gpus"
        found = [
            # spec: droplets/models/droplet.yml, `networks.v4`: each with `ip_address` and `type`
            # (public or private).
            d | {"networks": {"v4": self.networks(d["id"])}}
            for d in self.droplets.values()
            if d["size_slug"].startswith("gpu-") == gpus and (tag is None or tag in d["tags"])
        ]
        return 200, {"droplets": found, "links": {}, "meta": {"total": len(found)}}

    def create(self, body):
        # spec: droplets/models/droplet_single_create.yml `required: [name]`, and
        # droplet_create.yml `required: [size, image]` (`region` is optional; Veri sends it).
        for field in ("name", "size", "image"):
            if not isinstance((body or {}).get(field), str):
                return self.refuse_shape(f"{field} is required")
        if not isinstance(body.get("region", ""), str):
            return self.refuse_shape("region: a region slug")
        # spec: droplets/models/droplet_single_create.yml, `name.pattern`.
        if not re.fullmatch(r"[a-zA-Z0-9]?[a-z0-9A-Z.\-]*[a-z0-9A-Z]", body["name"]):
            return self.refuse_shape("name: only letters, digits, dots and dashes")
        tags = body.get("tags", [])
        # spec: tags/models/tags.yml, `name`: pattern ^[a-zA-Z0-9_\-\:]+$, maxLength 255.
        if not all(re.fullmatch(r"[a-zA-Z0-9_:-]{1,255}", t) for t in tags):
            return self.refuse_shape("tags: letters, digits, colons, dashes and underscores")
        # spec: droplets/models/droplet_create.yml, `user_data`: "It must be plain text and may
        # not exceed 64 KiB in size."
        if (
            not isinstance(body.get("user_data", ""), str)
            or len(body.get("user_data", "")) > 64 * 1024
        ):
            return self.refuse_shape("user_data: a string of at most 64 KiB")
        if refusal := self.refusals.get(body.get("region", "")):
            status, error_id, message = (
                refusal if isinstance(refusal, tuple) else (422, "unprocessable_entity", refusal)
            )
            return status, {"id": error_id, "message": message}
        droplet = {
            "id": self.new_id(),
            "name": body["name"],
            "status": "new",
            "size_slug": body["size"],
            "region": {"slug": body.get("region", "")},
            "image": {"slug": body["image"]},
            "tags": tags,
            "user_data": body.get("user_data", ""),
        }
        self.droplets[droplet["id"]] = droplet
        return self.lost.answer(202, {"droplet": droplet, "links": {}})

    def set_status(self, droplet_id: int, status: str) -> None:
        # spec: droplets/models/droplet.yml, `status`: new, active, off or archive.
        assert status in ("new", "active", "off", "archive"), status
        self.droplets[droplet_id]["status"] = status


class FakeVast(FakeApi):
    """https://docs.vast.ai/api-reference: search offers (bundles), accept one (asks), list and
    destroy instances. Errors have the documented shape (rate-limits-and-errors):
    `{"success": false, "error": "<code>", "msg": "<text>"}`. Rules cite the official CLI
    (github.com/vast-ai/vast-cli, `vast.py` and `vastai/SKILL.md`)."""

    # vastai/SKILL.md, "Instance status values" (`actual_status`; null while provisioning).
    STATUSES = (
        None,
        "created",
        "loading",
        "running",
        "stopped",
        "frozen",
        "exited",
        "rebooting",
        "unknown",
        "offline",
    )

    unauthorized = (
        401,
        {"success": False, "error": "invalid_user_key", "msg": "Invalid or missing API key."},
    )

    def __init__(self):
        self.offers: list[dict] = []
        self.instances: dict[int, dict] = {}
        self.taken: set[int] = set()  # accepted offers, which searches no longer list
        self.gone_on_accept: set[int] = set()  # listed, but someone else takes them first
        self.credit_left = True
        self.refuse_accept: tuple[int, dict] | None = None  # every accept answers this
        super().__init__()

    def add_offer(
        self, gpu_name: str, num_gpus: int, geolocation: str, price: float, disk_space=500.0
    ) -> int:
        offer_id = self.new_id()
        self.offers.append(
            {
                "id": offer_id,
                "ask_contract_id": offer_id,
                "gpu_name": gpu_name,
                "num_gpus": num_gpus,
                "geolocation": geolocation,
                "dph_total": price,
                "rentable": True,
                "verified": True,
                "disk_space": disk_space,
            }
        )
        return offer_id

    # A destroyed instance, as vast.py reads one (`status in ['destroyed', 'terminated',
    # 'offline']` after `destroy instance`): no longer billed.
    DESTROYED = "destroyed"

    def set_status(self, instance_id: int, status: str | None) -> None:
        assert status in self.STATUSES or status == self.DESTROYED, status
        self.instances[instance_id]["actual_status"] = status

    def route(self, method, path, query, body):
        if method == "POST" and path == "/api/v0/bundles/":
            return self.search(body or {})
        if match := re.fullmatch(r"/api/v0/asks/(\d+)/", path):
            if method != "PUT":
                return 405, {"success": False, "error": "method_not_allowed"}
            return self.accept(int(match.group(1)), body or {})
        if method == "GET" and path == "/api/v0/instances/":
            return 200, {"instances": list(self.instances.values())}
        if match := re.fullmatch(r"/api/v0/instances/(\d+)/", path):
            instance_id = int(match.group(1))
            if instance_id not in self.instances:
                return 404, {"success": False, "error": "no_such_instance"}
            if method == "DELETE":
                del self.instances[instance_id]
                return 200, {"success": True}
        return 404, {"success": False, "error": f"no route {method} {path}"}

    def search(self, query):
        # vast.py `parse_query`: each field's filter is an operator object ({"eq": ...},
        # {"gte": ...}); `search offers` always sends `rentable` and its `--type` on-demand,
        # reserved or bid (interruptible).
        for field in ("gpu_name", "num_gpus", "rentable"):
            if not isinstance(query.get(field), dict) or "eq" not in query[field]:
                return self.refuse_shape(f"{field}: an operator object such as {{'eq': ...}}")
        if query.get("type") not in ("on-demand", "ondemand", "bid", "reserved"):
            return self.refuse_shape("type: on-demand, bid or reserved")
        # The disk filter, as vast.py's `launch instance` sends it: `disk_space>={disk}`.
        min_disk = (query.get("disk_space") or {}).get("gte", 0)
        found = [
            o
            for o in self.offers
            if o["gpu_name"] == query["gpu_name"]["eq"]
            and o["num_gpus"] == query["num_gpus"]["eq"]
            and o["disk_space"] >= min_disk
            and o["id"] not in self.taken
        ]
        found.sort(key=lambda o: o["dph_total"])
        return 200, {"offers": found[: query.get("limit", 64)]}

    def accept(self, offer_id, body):
        # vast.py `create instance`: PUT asks/{id}/ with `image`, `disk` (GB, a float),
        # `onstart` (the commands, as text) and a `runtype` from `get_runtype` (ssh, jupyter,
        # args, ...; Veri sends ssh).
        if not isinstance(body.get("image"), str) or not body["image"]:
            return self.refuse_shape("image is required")
        if not isinstance(body.get("disk"), int | float):
            return self.refuse_shape("disk: a number of GB")
        if body.get("runtype") not in (None, "ssh", "jupyter", "args", "ssh_proxy", "ssh_direct"):
            return self.refuse_shape("runtype: ssh, jupyter, args, ...")
        if not isinstance(body.get("onstart", ""), str):
            return self.refuse_shape("onstart: a string of shell commands")
        if self.refuse_accept:
            return self.refuse_accept
        if not self.credit_left:
            return 400, {
                "success": False,
                "error": "insufficient_credit",
                "msg": "Your account lacks credit.",
            }
        offer = next((o for o in self.offers if o["id"] == offer_id), None)
        if offer is None or offer_id in self.taken or offer_id in self.gone_on_accept:
            return 400, {
                "success": False,
                "error": "no_such_ask",
                "msg": f"Instance type {offer_id} is no longer available.",
            }
        # An offer's `disk_space` is the most an accept can ask for ("disk storage space, in
        # GB", vast.py `search offers` fields); the CLI searches with `disk_space>={disk}`.
        if body["disk"] > offer["disk_space"]:
            return self.refuse_shape(f"disk: {body['disk']} GB is more than the offer's")
        self.taken.add(offer_id)
        instance_id = self.new_id()
        self.instances[instance_id] = {
            "id": instance_id,
            "actual_status": "loading",
            "label": body.get("label"),
            "gpu_name": offer["gpu_name"],
            "num_gpus": offer["num_gpus"],
            "onstart": body.get("onstart", ""),
            "image": body["image"],
        }
        return self.lost.answer(200, {"success": True, "new_contract": instance_id})


class FakeGcp(FakeApi):
    """https://cloud.google.com/compute/docs/reference/rest/v1/instances: insert, get, delete,
    aggregatedList, zoneOperations.get, with errors as Compute returns them (a 403 quota error; a
    stockout as the insert operation's error). The tests' client is anonymous: no token is
    checked. Each rule cites the page of Google's documentation it follows."""

    # https://cloud.google.com/compute/docs/instances/instance-lifecycle: a VM's `status`.
    STATUSES = (
        "PROVISIONING",
        "STAGING",
        "RUNNING",
        "STOPPING",
        "STOPPED",
        "SUSPENDING",
        "SUSPENDED",
        "REPAIRING",
        "TERMINATED",
    )
    # https://cloud.google.com/compute/docs/instances/about-flex-start-vms: Flex-start VMs
    # "can run for up to seven days".
    FLEX_START_MAX_RUN_SECONDS = 7 * 24 * 3600

    token = None
    PREFIX = r"/compute/v1/projects/(?P<project>[^/]+)"

    def __init__(self):
        self.vms: dict[tuple[str, str], dict] = {}  # (zone, name) -> instance
        self.stockouts: set[str] = set()  # zones without capacity
        self.quota_exceeded = False
        self.refuse_insert: tuple[int, dict] | None = None  # every insert answers this
        self.accelerators = [("us-east4-a", "nvidia-h100-80gb"), ("us-west1-a", "nvidia-a100-80gb")]
        self.waiting: set[str] = set()  # zones where Flex-start keeps looking for the GPU
        self.operations: dict[str, dict] = {}  # name -> operation
        self.by_request_id: dict[str, dict] = {}  # an insert's requestId -> its operation
        super().__init__()

    def set_status(self, zone: str, name: str, status: str) -> None:
        assert status in self.STATUSES, status
        self.vms[(zone, name)]["status"] = status

    def operation(self, zone: str, error: str | None = None, done: bool = True) -> dict:
        answer = {"kind": "compute#operation", "name": f"op-{self.new_id()}", "zone": zone}
        answer["status"] = "DONE" if done else "RUNNING"
        self.operations[answer["name"]] = answer
        if error:
            answer["error"] = {
                "errors": [{"code": "ZONE_RESOURCE_POOL_EXHAUSTED", "message": error}]
            }
            answer["httpErrorStatusCode"] = 503
            answer["httpErrorMessage"] = f"ZONE_RESOURCE_POOL_EXHAUSTED: {error}"
        return answer

    def route(self, method, path, query, body):
        match = re.fullmatch(self.PREFIX + r"/zones/(?P<zone>[^/]+)/instances", path)
        if match and method == "POST":
            # https://cloud.google.com/compute/docs/reference/rest/v1/instances/insert,
            # `requestId`: a request sent again with the same id is answered with the first
            # one's operation, not done twice.
            request_id = query.get("requestId")
            if request_id and request_id in self.by_request_id:
                return 200, self.by_request_id[request_id]
            result = self.insert(match["zone"], body or {})
            if request_id and result is not DROP and result[0] == 200:
                self.by_request_id[request_id] = result[1]
            if result is not DROP and result[0] == 200 and result[1].get("status") == "DONE":
                return self.lost.answer(*result) if not result[1].get("error") else result
            return result
        if match := re.fullmatch(
            self.PREFIX + r"/zones/(?P<zone>[^/]+)/operations/(?P<name>[^/]+)", path
        ):
            if match["name"] not in self.operations:
                return 404, {"error": {"code": 404, "message": f"no operation {match['name']}"}}
            return 200, self.operations[match["name"]]
        if match := re.fullmatch(
            self.PREFIX + r"/zones/(?P<zone>[^/]+)/instances/(?P<name>[^/]+)", path
        ):
            key = (match["zone"], match["name"])
            if key not in self.vms:
                return 404, {
                    "error": {"code": 404, "message": f"The resource '{path}' was not found"}
                }
            if method == "DELETE":
                del self.vms[key]
                return 200, self.operation(match["zone"])
            return 200, self.vms[key]
        if re.fullmatch(self.PREFIX + r"/aggregated/instances", path) and method == "GET":
            wanted = re.fullmatch(r"labels\.([a-z0-9_-]+)=([a-z0-9_-]+)", query.get("filter", ""))
            items: dict[str, dict] = {}
            for (zone, _), vm in self.vms.items():
                if wanted and vm.get("labels", {}).get(wanted[1]) != wanted[2]:
                    continue
                items.setdefault(f"zones/{zone}", {"instances": []})["instances"].append(vm)
            return 200, {"kind": "compute#instanceAggregatedList", "items": items}
        if re.fullmatch(self.PREFIX + r"/aggregated/acceleratorTypes", path) and method == "GET":
            wanted = re.fullmatch(r"name=([a-z0-9-]+)", query.get("filter", ""))
            items = {
                f"zones/{zone}": {
                    "acceleratorTypes": [{"name": name, "zone": zone, "maximumCardsPerInstance": 8}]
                }
                for zone, name in self.accelerators
                if not wanted or wanted[1] == name
            }
            return 200, {"kind": "compute#acceleratorTypeAggregatedList", "items": items}
        return 404, {"error": {"code": 404, "message": f"no route {method} {path}"}}

    def insert(self, zone, body):
        # https://cloud.google.com/compute/docs/reference/rest/v1/instances, `name`: 1-63
        # characters matching [a-z]([-a-z0-9]*[a-z0-9])?; `machineType`: a partial URL
        # zones/ZONE/machineTypes/TYPE.
        if not re.fullmatch(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?", body.get("name", "")):
            return self.refuse_shape("name: a lower-case RFC 1035 label")
        if not body.get("machineType", "").startswith(f"zones/{zone}/machineTypes/"):
            return self.refuse_shape("machineType: zones/ZONE/machineTypes/TYPE")
        scheduling = body.get("scheduling", {})
        if scheduling.get("provisioningModel") == "FLEX_START" and (
            refusal := self.flex_start_refusal(body, scheduling)
        ):
            return self.refuse_shape(refusal)
        # https://cloud.google.com/compute/docs/gpus/create-gpu-vm-accelerator-optimized: A3
        # machine types require the gVNIC network interface.
        machine = body["machineType"].rsplit("/", 1)[-1]
        if machine.startswith("a3-") and not any(
            n.get("nicType") == "GVNIC" for n in body.get("networkInterfaces", [])
        ):
            return self.refuse_shape("A3 machine types need a network interface with GVNIC")
        # https://cloud.google.com/compute/docs/labeling-resources, "Requirements for labels":
        # keys start with a lower-case letter; keys and values at most 63 lower-case letters,
        # digits, dashes and underscores.
        labels = body.get("labels", {})
        if not all(
            re.fullmatch(r"[a-z][a-z0-9_-]{0,62}", k) and re.fullmatch(r"[a-z0-9_-]{0,63}", v)
            for k, v in labels.items()
        ):
            return self.refuse_shape("labels: lower-case keys and values")
        # Not from GCP's documents: a guard that the tests' requests carry a boot disk and a
        # network, as every VM Veri launches needs (it refuses more than GCP, never less).
        if not body.get("disks") or not body.get("networkInterfaces"):
            return self.refuse_shape("disks and networkInterfaces are required")
        if self.refuse_insert:
            return self.refuse_insert
        if self.quota_exceeded:
            message = "Quota 'NVIDIA_H100_GPUS' exceeded.  Limit: 0.0 in region us-east4."
            return 403, {
                "error": {
                    "code": 403,
                    "message": message,
                    "errors": [{"reason": "quotaExceeded", "message": message}],
                }
            }
        if zone in self.stockouts:
            return 200, self.operation(
                zone,
                f"The zone 'projects/p/zones/{zone}' does not have enough resources available "
                "to fulfill the request.",
            )
        if (zone, body["name"]) in self.vms:
            return self.error(409, "alreadyExists", f"The resource '{body['name']}' already exists")
        vm = dict(body, status="PROVISIONING", zone=f"zones/{zone}", id=str(self.new_id()))
        self.vms[(zone, body["name"])] = vm
        # Flex-start holds the insert operation open while it looks for the GPU.
        return 200, self.operation(zone, done=zone not in self.waiting)

    def flex_start_refusal(self, body: dict, scheduling: dict) -> str | None:
        """What GCP refuses in a Flex-start request, from
        https://cloud.google.com/compute/docs/instances/create-flex-start-vm (the REST body) and
        https://cloud.google.com/compute/docs/instances/about-flex-start-vms ("Requirements")."""
        if scheduling.get("instanceTerminationAction") not in ("DELETE", "STOP"):
            return "FLEX_START needs instanceTerminationAction DELETE or STOP"
        seconds = int((scheduling.get("maxRunDuration") or {}).get("seconds", 0))
        if not 0 < seconds <= self.FLEX_START_MAX_RUN_SECONDS:
            return "FLEX_START needs a maxRunDuration of at most seven days"
        if scheduling.get("onHostMaintenance") != "TERMINATE":
            return "FLEX_START needs onHostMaintenance TERMINATE"
        # Flex-start VMs consume no reservation: reservationAffinity NO_RESERVATION.
        affinity = body.get("reservationAffinity") or {}
        if affinity.get("consumeReservationType") != "NO_RESERVATION":
            return "FLEX_START needs reservationAffinity.consumeReservationType NO_RESERVATION"
        return None

    @staticmethod
    def error(status: int, reason: str, message: str) -> tuple[int, dict]:
        """An error as Compute answers one: `{"error": {code, message, errors: [{reason}]}}`."""
        return status, {
            "error": {
                "code": status,
                "message": message,
                "errors": [{"message": message, "domain": "global", "reason": reason}],
            }
        }
