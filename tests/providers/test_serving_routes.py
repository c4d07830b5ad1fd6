"""How the router reaches a replica on a rented machine: at the address the provider reports for
the machine (never one the machine names), on a port the launch opened to
VERI_SERVING_ALLOWED_CIDR, with the replica's serving key. EC2 (moto behind the proxy) reports the
machine at 127.0.0.2, a loopback alias standing in for its public address, where a stand-in
replica server that requires the key listens."""

import json
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from rest_framework.test import APIClient

from serving import tasks
from serving.models import Replica
from serving.services import replicas
from tests.conftest import serve_in_background
from tests.providers.conftest import ec2_client

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


@pytest.fixture
def launched(api_client, ec2, settings, local_store_url, billed) -> Replica:
    """A deployment on AWS, its replica's machine launched; EC2 reports it at MACHINE."""
    settings.VERI_STORE = local_store_url
    settings.VERI_SERVING_ALLOWED_CIDR = CIDR
    created = api_client.post(
        "/v1/deployments",
        {"base_model": "Qwen/Qwen2.5-0.5B", "provider": "aws", "gpu_type": "L4-24GB"},
        format="json",
    )
    assert created.status_code == 201, created.json()
    replica = Replica.objects.get(deployment__public_id=created.json()["id"])
    assert tasks.launch_replica(replica_id=replica.pk) == "launched"
    replica.refresh_from_db()
    ec2.addresses[replica.external_id.partition("/")[2]] = MACHINE
    return replica


def worker_for(replica: Replica) -> APIClient:
    """The replica's machine, calling the control plane with its replica token."""
    worker = APIClient()
    worker.credentials(HTTP_AUTHORIZATION=f"Bearer {replicas.mint_token(replica=replica)}")
    return worker


def test_the_router_reaches_a_rented_replica_at_its_providers_address_with_its_key(
    api_client, launched, ec2_endpoint
):
    replica = launched
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
    [(authorization, body)] = KeyedReplica.asked
    assert authorization == f"Bearer {replicas.serving_key(replica=replica)}"
    assert body["messages"] == question
    # The key is the replica's own: another replica's machine cannot use it.
    assert replicas.serving_key(replica=replica).startswith("veri_sk_")
    assert api_client.raw_key not in authorization

    # Its machine got the serving group: the ports open to the setting's CIDR alone.
    ec2 = ec2_client(ec2_endpoint)
    instance_id = replica.external_id.partition("/")[2]
    [reservation] = ec2.describe_instances(InstanceIds=[instance_id])["Reservations"]
    [group] = reservation["Instances"][0]["SecurityGroups"]
    [rule] = ec2.describe_security_groups(GroupIds=[group["GroupId"]])["SecurityGroups"][0][
        "IpPermissions"
    ]
    assert (rule["IpProtocol"], rule["FromPort"], rule["ToPort"]) == ("tcp", 8000, 8009)
    assert [r["CidrIp"] for r in rule["IpRanges"]] == [CIDR]


def test_a_ready_report_naming_another_host_a_bad_port_or_a_gone_machine_is_refused(launched, ec2):
    replica = launched
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
    ec2.states[replica.external_id.partition("/")[2]] = "shutting-down"
    answer = worker.post(ready, {"url": "http://127.0.0.1:8001"}, format="json")
    assert answer.status_code == 400
    assert "no address" in answer.json()["error"]["message"]
    replica.refresh_from_db()
    assert replica.status == "starting" and not replica.url  # it times out as starting


@pytest.mark.parametrize("provider", ["digitalocean", "vast", "gcp"])
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
