"""The worker's line to the control plane: retries with backoff, and a shipper thread that buffers
logs and metrics and sends them every second, so training goes on while the API is unreachable
and the buffer drains when it is back."""

import logging
import os
import random
import threading
import time
from collections import deque
from datetime import UTC, datetime
from pathlib import Path

import httpx
from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception_type,
    retry_if_result,
    stop_after_attempt,
    stop_after_delay,
)

log = logging.getLogger("veri.worker")
RETRY_STATUSES = {429, 500, 502, 503, 504}
DEFAULT_PATIENCE_SECONDS = 1800
MAX_BACKOFF_SECONDS = 20


class ControlPlaneError(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def download(
    http: httpx.Client, url: str, target: Path, headers: dict[str, str] | None = None
) -> None:
    """One file from a (presigned) URL to `target`, streamed; `headers` as the spec gives them (a
    small file's byte range of its pack)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with http.stream("GET", url, headers=headers) as response:
        response.raise_for_status()
        with target.open("wb") as out:
            for chunk in response.iter_bytes(1024 * 1024):
                out.write(chunk)


class ControlPlane:
    """The runner's only line to the control plane. It holds the job token and renews it: first
    before its first request (the token it was launched with, which the machine's boot data and
    environment still hold, then stops working after a short overlap), then whenever the control
    plane said to (halfway through the token's lifetime). A renewal that fails is tried again a
    minute later; the token in hand keeps working meanwhile."""

    RENEW_RETRY_SECONDS = 60.0

    def __init__(
        self, *, api_url: str, job_id: str, token: str, timeout: float = 30.0, kind: str = "jobs"
    ):
        # kind "replicas": a deployment's serving process, whose replica token is not renewed
        # (it dies when the replica stops).
        self.http = httpx.Client(
            base_url=f"{api_url.rstrip('/')}/v1/worker/{kind}/{job_id}",
            timeout=timeout,
            headers={"Authorization": f"Bearer {token}", "User-Agent": "veri-worker/0.1"},
        )
        # time.monotonic() of the next renewal; 0: before the first call; inf: never
        self._renew_at = 0.0 if kind == "jobs" else float("inf")
        self._renewing = threading.Lock()  # the shipper thread and the runner share this client

    def renew_token(self) -> bool:
        """Swap the job token for a fresh one now; False (and another try in a minute) when the
        control plane did not give one."""
        with self._renewing:
            return self._renew()

    def _renew_if_due(self) -> None:
        if time.monotonic() < self._renew_at:
            return
        with self._renewing:
            if time.monotonic() >= self._renew_at:  # not just renewed by the other thread
                self._renew()

    def _renew(self) -> bool:
        try:
            response = self.http.post("/token")
            answer = response.json() if response.status_code == 200 else {}
            token, renew_after = answer["token"], float(answer["renew_after_seconds"])
        except (httpx.TransportError, ValueError, KeyError, TypeError):
            # Unreachable, or refused (a dead token: the request this precedes will say so).
            log.info("job token not renewed; trying again later")
            self._renew_at = time.monotonic() + self.RENEW_RETRY_SECONDS
            return False
        self.http.headers["Authorization"] = f"Bearer {token}"
        self._renew_at = time.monotonic() + renew_after
        self._keep_for_release(token)
        return True

    @staticmethod
    def _keep_for_release(token: str) -> None:
        """The machine's last act, after the runner exits, is to ask the control plane to delete
        it (`POST …/release`) with the job's current token: the bootstrap reads it from
        VERI_TOKEN_FILE (owner-only, like the bootstrap's own env file)."""
        path = os.environ.get("VERI_TOKEN_FILE")
        if not path:
            return
        fresh = Path(f"{path}.new")
        try:
            fresh.unlink(missing_ok=True)
            fd = os.open(fresh, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as out:
                out.write(token)
            fresh.replace(path)
        except OSError:
            log.warning("could not keep the job token for the machine's release")

    def call(self, method: str, path: str, *, json=None, attempts: int | None = None) -> dict:
        """One request, retried with backoff on connection errors, 5xx and 429: `attempts` times,
        or else for `VERI_WORKER_API_PATIENCE_SECONDS` (30 minutes): a control plane being
        restarted or redeployed must not end a training whose machine is still running."""
        self._renew_if_due()
        patience = float(
            os.environ.get("VERI_WORKER_API_PATIENCE_SECONDS", DEFAULT_PATIENCE_SECONDS)
        )
        try:
            response = Retrying(
                stop=stop_after_attempt(attempts) if attempts else stop_after_delay(patience),
                wait=_backoff,
                retry=retry_if_exception_type(httpx.TransportError)
                | retry_if_result(lambda answer: answer.status_code in RETRY_STATUSES),
                retry_error_callback=lambda state: state.outcome.result(),
            )(self.http.request, method, path, json=json)
        except httpx.TransportError as exc:
            raise ControlPlaneError(0, f"control plane unreachable: {exc}") from exc
        if response.status_code in RETRY_STATUSES:
            raise ControlPlaneError(response.status_code, response.text[:300])
        if response.status_code >= 400:
            try:
                message = response.json()["error"]["message"]
            except (ValueError, KeyError, TypeError):
                message = response.text[:300]
            raise ControlPlaneError(response.status_code, message)
        return response.json() if response.content else {}


def _backoff(state: RetryCallState) -> float:
    return min(0.5 * 2 ** (state.attempt_number - 1), MAX_BACKOFF_SECONDS) * (
        0.5 + random.random() / 2
    )


class Shipper:
    """Buffers log lines and metric points, ships them every `interval` seconds, and sends a
    heartbeat with the current step every `heartbeat_interval` seconds."""

    MAX_BUFFERED_LINES = 200_000  # beyond this the oldest lines are dropped (and counted)
    MAX_LINE_CHARS = 16_384  # what the control plane keeps of one line
    MAX_BATCH_CHARS = 1024**2  # one request stays well under the API's body limit

    def __init__(
        self,
        api: ControlPlane,
        *,
        interval: float = 1.0,
        heartbeat_interval: float = 10.0,
        on_stop=None,
        first_seq: int = 0,
    ):
        self.api, self.interval, self.heartbeat_interval = api, interval, heartbeat_interval
        self.on_stop = on_stop  # called once with {code, message} when the control plane asks
        self.lines: deque = deque()
        self.points: list[dict] = []
        self.sampled: list[dict] = []
        self.seq, self.step, self.dropped = first_seq, None, 0
        # The control plane said the job's log is full (VERI_MAX_LOG_BYTES): it drops every
        # later line, so they are not sent.
        self.log_full = False
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="veri-shipper", daemon=True)
        self.last_heartbeat = 0.0

    def start(self) -> "Shipper":
        self.thread.start()
        return self

    def line(self, text: str) -> None:
        text = text.replace("\x00", "\ufffd")[: self.MAX_LINE_CHARS]
        with self.lock:
            if self.log_full:
                self.dropped += 1
                return
            if len(self.lines) >= self.MAX_BUFFERED_LINES:
                self.lines.popleft()
                self.dropped += 1
            self.lines.append({"seq": self.seq, "text": text})
            self.seq += 1

    def metrics(self, step: int, values: dict) -> None:
        # Stamped now: the step's own time, not the flush's (a second or more later).
        at = datetime.now(UTC).isoformat()
        with self.lock:
            self.points.append({"step": step, "values": values, "at": at})
            self.step = max(self.step or 0, step)

    def samples(self, step: int, samples: list[dict]) -> None:
        with self.lock:
            self.sampled += [{"step": step, **sample} for sample in samples]

    def set_step(self, step: int) -> None:
        with self.lock:
            self.step = max(self.step or 0, step)

    def flush(self) -> bool:
        """Send what is buffered; True when everything got through."""
        with self.lock:
            lines, size = [], 0
            for line in self.lines:
                size += len(line["text"]) + 32
                if len(lines) == 2000 or (lines and size > self.MAX_BATCH_CHARS):
                    break
                lines.append(line)
            points = self.points[:2000]
            sampled = self.sampled[:64]
        try:
            if lines:
                answer = self.api.call("POST", "/logs", json={"lines": lines}, attempts=1)
                with self.lock:
                    for _ in lines:
                        self.lines.popleft()
                    if answer.get("log_truncated"):
                        self.log_full = True
                        self.dropped += len(self.lines)
                        self.lines.clear()
            if points:
                self.api.call("POST", "/metrics", json={"points": points}, attempts=1)
                with self.lock:
                    del self.points[: len(points)]
            if sampled:
                self.api.call("POST", "/samples", json={"samples": sampled}, attempts=1)
                with self.lock:
                    del self.sampled[: len(sampled)]
            if time.monotonic() - self.last_heartbeat >= self.heartbeat_interval:
                answer = self.api.call("POST", "/heartbeat", json={"step": self.step}, attempts=1)
                self.last_heartbeat = time.monotonic()
                if (stop := answer.get("stop")) and self.on_stop:
                    self.on_stop, on_stop = None, self.on_stop
                    on_stop(stop)
        except ControlPlaneError as exc:
            if exc.status in (400, 401, 404):
                raise  # the job is gone or the batch is refused: retrying cannot help
            return False
        with self.lock:
            return not self.lines and not self.points and not self.sampled

    def _loop(self) -> None:
        while not self.stopping.wait(self.interval):
            try:
                self.flush()
            except ControlPlaneError as exc:
                log.warning("shipping stopped: %s", exc)
                return

    def close(self, timeout: float = 120.0) -> None:
        """Stop the thread, then drain the buffer (trying for up to `timeout` seconds)."""
        self.stopping.set()
        self.thread.join()
        deadline = time.monotonic() + timeout
        self.last_heartbeat = 0.0
        while time.monotonic() < deadline:
            try:
                if self.flush():
                    return
            except ControlPlaneError:
                return
            time.sleep(1)


def heartbeat(api: ControlPlane, heard: float, silent_seconds: float) -> float | None:
    """One heartbeat: when the control plane was last heard from, or None once this replica is
    over: stopped (its token died with it), or unheard for as long as the control plane waits
    before failing a silent replica (it routes nothing here by then; a control plane that went
    away leaves no serving process behind)."""
    try:
        api.call("POST", "/heartbeat", attempts=3)
    except ControlPlaneError as exc:
        if exc.status in (401, 403, 404):
            return None
        return heard if time.monotonic() - heard < silent_seconds else None
    return time.monotonic()
