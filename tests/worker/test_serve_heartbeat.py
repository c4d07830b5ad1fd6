"""A serving process's heartbeat (worker.client.heartbeat, used by the CPU engine and the vLLM
launcher) against real HTTP: it goes on through the control plane's trouble, ends the replica
when the control plane no longer knows it, and ends it too once the control plane has been away
as long as it waits before failing a silent replica, so no serving process outlives it."""

import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.conftest import serve_in_background
from worker.client import ControlPlane, heartbeat

SILENT = 120.0


class ControlPlaneStandIn(BaseHTTPRequestHandler):
    status = 200

    def do_POST(self):  # noqa: N802 - the base class's name
        self.send_response(self.status)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args):
        pass


@pytest.fixture
def control_plane():
    server = serve_in_background(ThreadingHTTPServer(("127.0.0.1", 0), ControlPlaneStandIn))
    yield server
    server.shutdown()
    server.server_close()


def api(port: int) -> ControlPlane:
    return ControlPlane(
        api_url=f"http://127.0.0.1:{port}", job_id="rep_x", token="t", kind="replicas"
    )


def test_a_heard_heartbeat_counts_from_now(control_plane):
    ControlPlaneStandIn.status = 200
    long_ago = time.monotonic() - 10 * SILENT
    assert heartbeat(api(control_plane.server_port), long_ago, SILENT) > long_ago


@pytest.mark.parametrize("status", [401, 403, 404])
def test_a_replica_the_control_plane_no_longer_knows_ends(control_plane, status):
    ControlPlaneStandIn.status = status
    assert heartbeat(api(control_plane.server_port), time.monotonic(), SILENT) is None


def test_an_unreachable_control_plane_is_waited_for_then_the_replica_ends(control_plane):
    port = control_plane.server_port
    control_plane.shutdown()
    control_plane.server_close()  # nothing listens there now
    heard = time.monotonic()
    assert heartbeat(api(port), heard, SILENT) == heard  # a blip: still serving
    assert heartbeat(api(port), heard - SILENT, SILENT) is None  # away as long as that: over
