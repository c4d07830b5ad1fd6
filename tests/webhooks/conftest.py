import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.conftest import serve_in_background
from tests.dashboard.conftest import browser, owner  # noqa: F401 - the shared fixtures
from tests.e2e.conftest import qcluster  # noqa: F401
from tests.sdk.conftest import cli  # noqa: F401
from tests.training.conftest import dataset, submit  # noqa: F401


class Receiver:
    """A real HTTP server on loopback standing in for a customer's endpoint: it answers the
    statuses queued in `answers` (then 200) and keeps every request it got."""

    def __init__(self):
        self.requests: list[dict] = []
        self.answers: list[int] = []
        self.delay = 0.0
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                receiver.requests.append(
                    {"path": self.path, "headers": dict(self.headers), "body": body}
                )
                time.sleep(receiver.delay)
                status = receiver.answers.pop(0) if receiver.answers else 200
                self.send_response(status)
                self.send_header("Content-Type", "text/plain")
                self.end_headers()
                self.wfile.write(f"answered {status}".encode())

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/hooks/veri"
        serve_in_background(self.server)


@pytest.fixture
def receiver():
    receiver = Receiver()
    yield receiver
    receiver.server.shutdown()
