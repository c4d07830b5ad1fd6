"""Preemption notices: the worker reads AWS's and GCP's metadata services as they answer (fakes on
loopback that refuse a request of the wrong shape), the local provider's notice file, and tells
the control plane (see tests/training/test_restarts.py for what it does with the notice)."""

import json
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from tests.conftest import serve_in_background
from worker.preemption import (
    AwsSpotNotice,
    FileNotice,
    GcpNotice,
    Notice,
    PreemptionWatch,
    notice_source,
)


class Metadata(BaseHTTPRequestHandler):
    """A metadata service: `answers` maps a path to (status, body); `refused` counts requests
    that the real service would refuse (no IMDSv2 token, no Metadata-Flavor header)."""

    answers: dict[str, tuple[int, str]] = {}
    refused: list[str] = []
    token = "imds-token"

    def _send(self, status: int, body: str) -> None:
        payload = body.encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def do_PUT(self):
        if self.path != "/latest/api/token" or not self.headers.get(
            "X-aws-ec2-metadata-token-ttl-seconds"
        ):
            Metadata.refused.append(self.path)
            return self._send(400, "")
        self._send(200, self.token)

    def do_GET(self):
        aws = self.path.startswith("/latest/")
        if aws and self.headers.get("X-aws-ec2-metadata-token") != self.token:
            Metadata.refused.append(self.path)
            return self._send(401, "")
        if not aws and self.headers.get("Metadata-Flavor") != "Google":
            Metadata.refused.append(self.path)
            return self._send(403, "Missing Metadata-Flavor:Google header.")
        self._send(*Metadata.answers.get(self.path, (404, "Not Found")))

    def log_message(self, *args):
        pass


@pytest.fixture
def metadata():
    Metadata.answers, Metadata.refused = {}, []
    server = ThreadingHTTPServer(("127.0.0.1", 0), Metadata)
    serve_in_background(server)
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()
    assert Metadata.refused == []  # every request had the shape the real service requires


def test_aws_spot_interruption_notice(metadata):
    check = AwsSpotNotice(metadata)
    assert check() is None  # 404 until AWS decides
    Metadata.answers["/latest/meta-data/spot/instance-action"] = (
        200,
        json.dumps({"action": "terminate", "time": "2026-12-03T12:02:00Z"}),
    )
    assert check() == Notice("aws", "2026-12-03T12:02:00Z")


def test_aws_token_expiry_fetches_a_new_one(metadata):
    check = AwsSpotNotice(metadata)
    check.token = "expired"
    assert check() is None and check.token is None
    Metadata.refused.clear()  # the expired token's one refusal is what this test is about
    Metadata.answers["/latest/meta-data/spot/instance-action"] = (
        200,
        json.dumps({"action": "stop", "time": "2026-12-03T12:02:00Z"}),
    )
    assert check() == Notice("aws", "2026-12-03T12:02:00Z")


def test_gcp_preemption_and_host_maintenance_notices(metadata):
    check = GcpNotice(metadata)
    base = "/computeMetadata/v1/instance"
    Metadata.answers = {
        f"{base}/preempted": (200, "FALSE"),
        f"{base}/maintenance-event": (200, "NONE"),
    }
    assert check() is None
    Metadata.answers[f"{base}/maintenance-event"] = (200, "TERMINATE_ON_HOST_MAINTENANCE")
    assert check() == Notice("gcp", None)
    Metadata.answers = {f"{base}/preempted": (200, "TRUE")}
    assert check() == Notice("gcp", None)


def test_the_local_notice_file(tmp_path):
    path = tmp_path / "preemption-notice.json"
    check = FileNotice(str(path))
    assert check() is None
    path.write_text("{half")
    assert check() is None
    path.write_text(json.dumps({"terminates_at": "2026-12-03T12:02:00+00:00"}))
    assert check() == Notice("local", "2026-12-03T12:02:00+00:00")


def test_the_source_comes_from_the_provider_setting(tmp_path):
    assert isinstance(notice_source("aws"), AwsSpotNotice)
    assert isinstance(notice_source("gcp"), GcpNotice)
    assert notice_source(f"file:{tmp_path}/n.json").path == tmp_path / "n.json"
    assert notice_source(None) is None and notice_source("azure") is None


def test_the_watch_outlasts_a_silent_metadata_service_and_reports_once():
    answers = [httpx.ConnectError("refused"), None, Notice("aws", None), Notice("aws", None)]
    seen = []

    def check():
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    watch = PreemptionWatch(check, seen.append, interval=0.01).start()
    watch.thread.join(timeout=5)
    assert seen == [Notice("aws", None)] and answers == [Notice("aws", None)]


def test_a_pause_after_the_flush_resumes_when_the_machine_stays(tmp_path, monkeypatch):
    """A notice that was wrong (the machine still here well after the given time) does not
    leave the training paused for ever."""
    import subprocess
    import sys

    from worker import runner

    monkeypatch.setattr(runner, "PAUSE_AFTER_NOTICE_SECONDS", 0.5)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        work = runner.Runner(
            job_id="job_x",
            api_url="http://127.0.0.1:9",
            token="t",
            work_dir=tmp_path,
            mount_root=tmp_path,
        )
        work.child, work.ranks, work.notice = child, [child], Notice("local", None)
        work._pause_after_flush(7)
        time.sleep(0.2)
        assert _state(child.pid) == "T"  # stopped
        time.sleep(1)
        assert _state(child.pid) in ("S", "R")  # going on
    finally:
        child.kill()
        child.wait()


def _state(pid: int) -> str:
    from pathlib import Path

    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
