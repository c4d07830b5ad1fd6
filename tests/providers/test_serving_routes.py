"""How the router reaches a replica on a rented machine: at the address the provider reports for
the machine (never one the machine names), on a port the launch opened to
VERI_SERVING_ALLOWED_CIDR, with the replica's serving key. The provider's fake (EC2: moto behind
the proxy; DigitalOcean's) reports the machine at 127.0.0.2, a loopback alias standing in for its
public address, where a stand-in replica server that requires the key listens."""

import json
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from rest_framework.test import APIClient

from serving import tasks
from serving.models import Deployment, Replica
from serving.services import replicas
from tests.conftest import serve_in_background
from tests.providers.conftest import ec2_client
from tests.providers.rest_fakes import FakeDigitalOcean

pytestmark = pytest.mark.django_db
MACHINE = "127.0.0.2"
CIDR = "203.0.113.0/24"


class KeyedReplica(BaseHTTPRequestHandler):
    """A replica's server: it answers a chat only with its key, keeping what it was asked."""

    key = ""
    asked: list = []

    def do_POST(self):  # noqa: N802 - the base class's name
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        KeyedReplica.asked.append((self.headers.get("Authorization"), body))
        if self.headers.get("Authorization") != f"Bearer {KeyedReplica.key}":
            self.send_response(401)
            self.end_headers()
            return
        answer = json.dumps({"object": "chat.completion", "choices": [{"index": 0}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *args):
        pass


def serving_port(host: str) -> ThreadingHTTPServer:
    """The stand-in replica server on `host`, on the first free port of those the providers open
    (8000-8009)."""
    for port in range(8000, 8010):
        try:
            return ThreadingHTTPServer((host, port), KeyedReplica)
        except OSError:
            continue
    raise AssertionError("no free serving port")


def ec2_machine(replica: Replica) -> str:
    return replica.external_id.partition("/")[2]


def aws_place(fake, replica: Replica, address: str) -> None:
    fake.addresses[ec2_machine(replica)] = address


def aws_gone(fake, replica: Replica) -> None:
    fake.states[ec2_machine(replica)] = "shutting-down"


def aws_opened(fake, replica: Replica, request) -> list[tuple]:
    """(protocol, from port, to port, sources) of each inbound rule of the machine's groups."""
    ec2 = ec2_client(request.getfixturevalue("ec2_endpoint"))
    [reservation] = ec2.describe_instances(InstanceIds=[ec2_machine(replica)])["Reservations"]
    groups = [g["GroupId"] for g in reservation["Instances"][0]["SecurityGroups"]]
    rules = [
        rule
        for group in ec2.describe_security_groups(GroupIds=groups)["SecurityGroups"]
        for rule in group["IpPermissions"]
    ]
    return [
        (r["IpProtocol"], r["FromPort"], r["ToPort"], [c["CidrIp"] for c in r["IpRanges"]])
        for r in rules
    ]


def do_place(fake: FakeDigitalOcean, replica: Replica, address: str) -> None:
    fake.addresses[int(replica.external_id)] = address
    fake.set_status(int(replica.external_id), "active")


def do_gone(fake: FakeDigitalOcean, replica: Replica) -> None:
    fake.set_status(int(replica.external_id), "off")


def do_opened(fake: FakeDigitalOcean, replica: Replica, request) -> list[tuple]:
    """The inbound rules of the firewalls that apply to the droplet (by its tags)."""
    tags = set(fake.droplets[int(replica.external_id)]["tags"])
    return [
        (rule["protocol"], *map(int, rule["ports"].split("-")), rule["sources"]["addresses"])
        for firewall in fake.firewalls.values()
        if tags & set(firewall["tags"])
        for rule in firewall["inbound_rules"]
    ]


# (provider, its fake's fixture, gpu_type, place the machine at an address, take it away, the
# inbound rules that apply to it)
PROVIDERS = [
    ("aws", "ec2", "L4-24GB", aws_place, aws_gone, aws_opened),
    ("digitalocean", "digitalocean", "H100-80GB", do_place, do_gone, do_opened),
]


@pytest.fixture(params=PROVIDERS, ids=[p[0] for p in PROVIDERS])
def launched(request, api_client, settings, local_store_url, billed):
    """A deployment on the provider, its replica's machine launched, which the provider's fake
    reports at MACHINE: (the replica, the fake, the provider's row of PROVIDERS)."""
    provider, fixture, gpu_type, place, *_ = request.param
    fake = request.getfixturevalue(fixture)
    settings.VERI_STORE = local_store_url
    settings.VERI_SERVING_ALLOWED_CIDR = CIDR
    created = api_client.post(
        "/v1/deployments",
        {"base_model": "Qwen/Qwen2.5-0.5B", "provider": provider, "gpu_type": gpu_type},
        format="json",
    )
    assert created.status_code == 201, created.json()
    replica = Replica.objects.get(deployment__public_id=created.json()["id"])
    assert tasks.launch_replica(replica_id=replica.pk) == "launched"
    replica.refresh_from_db()
    place(fake, replica, MACHINE)
    return replica, fake, request.param


def worker_for(replica: Replica) -> APIClient:
    """The replica's machine, calling the control plane with its replica token."""
    worker = APIClient()
    worker.credentials(HTTP_AUTHORIZATION=f"Bearer {replicas.mint_token(replica=replica)}")
    return worker


def test_the_router_reaches_a_rented_replica_at_its_providers_address_with_its_key(
    request, api_client, launched
):
    replica, fake, (*_, opened) = launched
    server = serving_port(MACHINE)
    serve_in_background(server)
    port = server.server_address[1]
    KeyedReplica.key, KeyedReplica.asked = replicas.serving_key(replica=replica), []
    try:
        ready = worker_for(replica).post(
            f"/v1/worker/replicas/{replica.public_id}/ready",
            {"url": f"http://127.0.0.1:{port}"},  # its own loopback: only the port is taken
            format="json",
        )
        assert ready.status_code == 200, ready.json()
        replica.refresh_from_db()
        assert (replica.status, replica.url) == ("ready", f"http://{MACHINE}:{port}")

        question = [{"role": "user", "content": "Name a fruit."}]
        answer = api_client.post(
            "/v1/chat/completions",
            {"model": "Qwen/Qwen2.5-0.5B", "messages": question},
            format="json",
        )
        assert answer.status_code == 200
        assert json.loads(b"".join(answer.streaming_content))["object"] == "chat.completion"
    finally:
        server.shutdown()
        server.server_close()
    [(authorization, body)] = KeyedReplica.asked
    assert authorization == f"Bearer {replicas.serving_key(replica=replica)}"
    assert body["messages"] == question
    # The key is the replica's own (another replica's machine holds another), never an API key.
    other = Replica(public_id="rep_other")
    assert replicas.serving_key(replica=other) != replicas.serving_key(replica=replica)
    assert api_client.raw_key not in authorization

    # Its machine's serving ports are open to the setting's CIDR, and nothing else is.
    assert opened(fake, replica, request) == [("tcp", 8000, 8009, [CIDR])]


def test_a_ready_report_naming_another_host_a_bad_port_or_a_gone_machine_is_refused(launched):
    replica, fake, (*_, gone, _) = launched
    worker = worker_for(replica)
    ready = f"/v1/worker/replicas/{replica.public_id}/ready"
    for elsewhere in (
        f"http://{MACHINE}:8001",  # the machine's address is the provider's to say
        "http://10.0.0.7:8001",
        "http://169.254.169.254:8001/latest",
        "http://127.0.0.1:22",  # not a serving port
        "http://127.0.0.1:8010",
        "http://127.0.0.1",
    ):
        answer = worker.post(ready, {"url": elsewhere}, format="json")
        assert answer.status_code == 400, elsewhere
        assert answer.json()["error"]["field"] == "url"
    gone(fake, replica)
    answer = worker.post(ready, {"url": "http://127.0.0.1:8001"}, format="json")
    assert answer.status_code == 400
    assert "no address" in answer.json()["error"]["message"]
    replica.refresh_from_db()
    assert replica.status == "starting" and not replica.url  # it times out as starting


@pytest.mark.parametrize("provider", ["vast", "gcp"])
def test_providers_that_cannot_open_a_serving_port_refuse_deployments(
    request, api_client, billed, provider
):
    request.getfixturevalue(provider)
    created = api_client.post(
        "/v1/deployments",
        {"base_model": "Qwen/Qwen2.5-0.5B", "provider": provider, "gpu_type": "H100-80GB"},
        format="json",
    )
    assert created.status_code == 400
    error = created.json()["error"]
    assert (error["code"], error["field"]) == ("provider_not_supported", "provider")
    assert not Replica.objects.exists()  # nothing rented


def test_a_replica_of_a_deployment_made_before_its_provider_stopped_serving_rents_nothing(
    vast, billed
):
    deployment = Deployment.objects.create(
        workspace=billed,
        base_model="Qwen/Qwen2.5-0.5B",
        gpu_type="RTX4090-24GB",
        provider="vast",
        region="us-east-1",
        status="starting",
    )
    replica = Replica.objects.create(deployment=deployment, provider="vast")
    assert tasks.launch_replica(replica_id=replica.pk) == "provisioning_error"
    replica.refresh_from_db()
    assert (replica.status, replica.error_code) == ("failed", "provisioning_error")
    assert "vast does not serve deployments yet" in replica.error_message
    assert vast.instances == {} and vast.calls("PUT", r"/api/v0/asks/.*") == []
