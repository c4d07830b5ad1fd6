"""Warnings that the machine is about to be taken away: AWS's spot interruption notice (two
minutes ahead, through the instance metadata service), GCP's preemption and host-maintenance
terminations (through its metadata server), and the local provider's simulated notice (a file).
The runner polls the source its provider named in VERI_WORKER_PREEMPTION_NOTICE and, on a
notice, has the training save a checkpoint at once."""

import json
import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import httpx

log = logging.getLogger("veri.worker")

AWS_METADATA = "http://169.254.169.254"
GCP_METADATA = "http://metadata.google.internal"


class Notice(NamedTuple):
    source: str  # "aws", "gcp", "local"
    terminates_at: str | None  # ISO 8601 when the provider says


class AwsSpotNotice:
    """IMDSv2: a session token, then `spot/instance-action`, which answers 404 until AWS has
    decided to stop or terminate the instance."""

    def __init__(self, base: str = AWS_METADATA):
        self.http = httpx.Client(base_url=base, timeout=2)
        self.token: str | None = None

    def __call__(self) -> Notice | None:
        if self.token is None:
            self.token = self.http.put(
                "/latest/api/token", headers={"X-aws-ec2-metadata-token-ttl-seconds": "21600"}
            ).text
        answer = self.http.get(
            "/latest/meta-data/spot/instance-action",
            headers={"X-aws-ec2-metadata-token": self.token},
        )
        if answer.status_code == 401:  # the session token expired: a new one next time
            self.token = None
            return None
        if answer.status_code != 200:
            return None
        action = answer.json()
        if action.get("action") not in ("terminate", "stop", "hibernate"):
            return None
        return Notice("aws", action.get("time"))


class GcpNotice:
    """`instance/preempted` turns TRUE when GCP preempts the VM; a GPU VM, which cannot be live
    migrated, is terminated for host maintenance after `maintenance-event` announces it."""

    HEADERS = {"Metadata-Flavor": "Google"}

    def __init__(self, base: str = GCP_METADATA):
        self.http = httpx.Client(base_url=base, timeout=2, headers=self.HEADERS)

    def __call__(self) -> Notice | None:
        base = "/computeMetadata/v1/instance"
        preempted = self.http.get(f"{base}/preempted")
        if preempted.status_code == 200 and preempted.text.strip() == "TRUE":
            return Notice("gcp", None)
        maintenance = self.http.get(f"{base}/maintenance-event")
        if maintenance.status_code == 200 and maintenance.text.strip().startswith("TERMINATE"):
            return Notice("gcp", None)
        return None


class FileNotice:
    """The local provider's simulated notice: a JSON file that appears in the machine's folder."""

    def __init__(self, path: str):
        self.path = Path(path)

    def __call__(self) -> Notice | None:
        try:
            body = json.loads(self.path.read_text())
        except (FileNotFoundError, ValueError):
            return None
        when = body.get("terminates_at") if isinstance(body, dict) else None
        return Notice("local", when if isinstance(when, str) else None)


def notice_source(setting: str | None) -> Callable[[], Notice | None] | None:
    """The check for VERI_WORKER_PREEMPTION_NOTICE: `aws`, `gcp`, `file:PATH`, or none."""
    if not setting:
        return None
    if setting == "aws":
        return AwsSpotNotice()
    if setting == "gcp":
        return GcpNotice()
    if setting.startswith("file:"):
        return FileNotice(setting.removeprefix("file:"))
    log.warning("unknown VERI_WORKER_PREEMPTION_NOTICE %r: not watching for notices", setting)
    return None


class PreemptionWatch:
    """Polls `check` every `interval` seconds until a notice comes, then calls `on_notice` once.
    A metadata service that does not answer is no notice."""

    def __init__(
        self, check: Callable[[], Notice | None], on_notice: Callable[[Notice], None], interval
    ):
        self.check, self.on_notice, self.interval = check, on_notice, interval
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="veri-preemption", daemon=True)

    def start(self) -> "PreemptionWatch":
        self.thread.start()
        return self

    def stop(self) -> None:
        self.stopping.set()

    def _loop(self) -> None:
        while not self.stopping.wait(self.interval):
            try:
                notice = self.check()
            except (httpx.HTTPError, OSError, ValueError) as exc:
                log.debug("preemption check failed: %s", exc)
                continue
            if notice:
                self.on_notice(notice)
                return
