"""The worker's steps: register → spec → mount volumes → load → train → checkpoints → upload →
complete. Training runs in a child process (`worker.train`) whose output is the job's log and whose
events (JSON lines on a pipe) drive metrics, heartbeats and checkpoint uploads; whatever happens to
it, the runner reports how the job ended."""

import json
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path

import httpx

from worker import outputs, sandbox
from worker.build import build_id
from worker.client import ControlPlane, ControlPlaneError, Shipper, download
from worker.errors import TRAINING_CODES, JobFailure
from worker.preemption import Notice, PreemptionWatch, notice_source
from worker.volumes import mount_volumes
from worker.wandb_report import KEY as WANDB_KEY
from worker.wandb_report import WandbRun

# How long a paused training waits past the provider's termination time (or past the notice,
# when the provider gave no time) before deciding the machine stays after all.
PAUSE_AFTER_NOTICE_SECONDS = 180


TAIL_LINES = 40  # of each rank other than 0, shown when a job fails
LOST_RANK_GRACE_SECONDS = 10
HARDWARE_CHECK_SECONDS = 180
# No step for this long (or three times the median step time, when longer) with every rank
# alive: a multi-GPU training stalled.
STALL_SECONDS = float(os.environ.get("VERI_WORKER_STALL_SECONDS") or 600)


def _device(job: dict) -> str:
    return "cpu" if job["gpu_type"] == "cpu" else "cuda"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _rank_env(rank: int, world: int, port: int) -> dict:
    """One rank's place in the training, as torchrun sets it for one machine."""
    if world == 1:
        return {}
    return {
        "RANK": str(rank),
        "LOCAL_RANK": str(rank),
        "WORLD_SIZE": str(world),
        "LOCAL_WORLD_SIZE": str(world),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
    }


def _how_it_ended(status: int) -> str:
    return f"was killed by signal {-status}" if status < 0 else f"exited with {status}"


def _wait_or_kill(rank: subprocess.Popen) -> int:
    """A rank's exit status; one still running once rank 0 has ended is waiting for it in a
    collective that will never come: stopped after a grace period."""
    try:
        return rank.wait(timeout=LOST_RANK_GRACE_SECONDS)
    except subprocess.TimeoutExpired:
        rank.kill()
        return rank.wait()


def _keep_tail(rank: subprocess.Popen, tail: deque) -> None:
    for raw in iter(rank.stdout.readline, b""):
        tail.append(raw.decode("utf-8", "replace").rstrip("\n"))


def check_hardware(device: str, world: int) -> JobFailure | None:
    """Run worker.hardware on every rank (no customer code): None when every rank passed, else
    the failure, `hardware_error` or (torch cannot use the GPUs there) `provisioning_error`."""
    port = _free_port()
    checks = [
        subprocess.Popen(
            [sys.executable, "-P", "-m", "worker.hardware", device],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=os.environ | _rank_env(rank, world, port),
            text=True,
        )
        for rank in range(world)
    ]
    problems, code = [], "hardware_error"
    for rank, check in enumerate(checks):
        try:
            output, _ = check.communicate(timeout=HARDWARE_CHECK_SECONDS)
        except subprocess.TimeoutExpired:
            check.kill()
            problems.append(f"rank {rank} did not finish the check in {HARDWARE_CHECK_SECONDS} s")
            continue
        result = _last_json(output)
        if result is None:
            problems.append(f"rank {rank}'s check ended without a result: {output[-300:]!r}")
        elif not result["ok"]:
            problems.append(f"rank {rank}: {result['problem']}")
            if result.get("code") == "provisioning_error":
                code = "provisioning_error"
    return JobFailure(code, "; ".join(problems)) if problems else None


def _last_json(output: str) -> dict | None:
    for line in reversed(output.splitlines()):
        try:
            found = json.loads(line)
        except ValueError:
            continue
        if isinstance(found, dict) and "ok" in found:
            return found
    return None


EVENT_KINDS = {"loaded", "running", "step", "saving", "metrics", "samples", "checkpoint"}
END_KINDS = {"error", "finished", "stopped"}


def _step(value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**31:
        raise ValueError(f"step {value!r}")
    return value


def _parse_event(raw: str) -> dict:
    """One event line of the training process, checked: it is customer code's to write, so a
    line that is not a well-formed event ends the training as its own error."""
    try:
        event = json.loads(raw)
        kind = event["event"]
        if kind not in EVENT_KINDS | END_KINDS:
            raise ValueError(f"kind {kind!r}")
        if kind not in ("loaded", "running", "error"):
            event["step"] = _step(event.get("step", 0))
        if kind == "error":
            event["code"], event["message"] = str(event["code"]), str(event["message"])[:10_000]
        if kind == "metrics" and not isinstance(event["values"], dict):
            raise ValueError("metrics without values")
        if kind == "samples" and not isinstance(event["samples"], list):
            raise ValueError("samples without a list")
        return event
    except (ValueError, KeyError, TypeError, RecursionError) as exc:
        return {
            "event": "error",
            "code": "training_error",
            "message": f"the training process sent a malformed event ({exc}): {raw[:200]!r}",
        }


class Runner:
    def __init__(self, *, job_id: str, api_url: str, token: str, work_dir: Path, mount_root: Path):
        self.api = ControlPlane(api_url=api_url, job_id=job_id, token=token)
        self.job_id, self.work, self.mount_root = job_id, work_dir, mount_root
        self.home = work_dir / "home"  # the training's: its working folder and outputs
        self.shipper: Shipper | None = None
        self.http = httpx.Client(timeout=600)
        self.child: subprocess.Popen | None = None
        self.stop: dict | None = None  # the control plane asked: save a checkpoint and end
        self.notice: Notice | None = None  # the provider warned: save a checkpoint now
        self.ranks: list[subprocess.Popen] = []  # one training process per device; rank 0 first
        self.lost_rank: tuple[int, int] | None = None  # (rank, exit status) of the first to die
        self.stalled, self.paused, self.saving = False, False, False
        self.flushed: int | None = None  # the preemption's checkpoint, until the pause
        self.step_times: deque = deque(maxlen=50)
        self.last_step: int | None = None
        # Signals for the training processes wait until they have set their handlers (training
        # has begun on every rank) and stop once training is over: their default action kills.
        self.child_signals, self.signals_waiting = "not yet", []  # → "listening" → "over"
        self.signals_lock = threading.Lock()
        self.wandb: WandbRun | None = None

    def say(self, text: str) -> None:
        print(text, flush=True)
        if self.shipper:
            self.shipper.line(text)

    def run(self) -> int:
        try:
            self.api.call("POST", "/register", json=registration())
            spec = self.api.call("GET", "/spec")
            # The runner's alone: out of the spec before it becomes the training's job file.
            secrets = spec.pop("secrets", None) or {}
            self.shipper = Shipper(
                self.api,
                heartbeat_interval=spec["heartbeat_interval_seconds"],
                on_stop=self.stop_training,
                first_seq=spec.get("log_seq_start", 0),
            ).start()
            self.say(f"[veri] worker for {self.job_id}: {spec['method']} on {spec['base_model']}")
            self.watch_for_preemption()
            free = os.environ.get(
                "VERI_WORKER_ASSUME_FREE_DISK_BYTES"
            )  # for nodes that misreport disk
            syncing = time.monotonic()
            mounts = mount_volumes(self.api, self.mount_root, self.say, int(free) if free else None)
            self.report_timing(
                "volumes_synced",
                synced_bytes=_bytes_under(set(mounts.values())),
                sync_seconds=time.monotonic() - syncing,
            )
            job = self.prepare(spec, mounts)
            self.wandb = WandbRun.start(
                spec, key=secrets.get(WANDB_KEY), work=self.work, say=self.say
            )
            self.train(job)
            self.upload_final(job)
            self.finish(ok=True)
            return 0
        except JobFailure as failure:
            self.say(f"[veri] failed: {failure.code}: {failure.message}")
            self.finish(ok=False, code=failure.code, message=failure.message)
        except ControlPlaneError as exc:
            print(f"[veri] the control plane refused or could not be reached: {exc}", flush=True)
            self.end_wandb(ok=False)
        except Exception as exc:  # noqa: BLE001 - a crash in the worker itself is still reported
            self.say(traceback.format_exc())
            self.finish(ok=False, code="training_error", message=f"the worker crashed: {exc!r}")
        return 1

    def stop_training(self, stop: dict) -> None:
        """The control plane asked for an end (budget, balance): the training process saves a
        checkpoint at its next step and stops (SIGUSR1, see worker.train)."""
        self.stop = stop
        self.say(f"[veri] stopping: {stop['code']}: {stop['message']}")
        self.signal_child(signal.SIGUSR1)

    def signal_child(self, sig: int) -> None:
        with self.signals_lock:
            if self.child_signals == "listening":
                self._signal_ranks(sig)
            elif self.child_signals == "not yet":
                self.signals_waiting.append(sig)

    def _child_listens(self) -> None:
        with self.signals_lock:
            self.child_signals = "listening"
            for sig in self.signals_waiting:
                self._signal_ranks(sig)

    def _signal_ranks(self, sig: int) -> None:
        """Every rank: they agree on the step to act at (see worker.train's callback)."""
        for rank in self.ranks:
            if rank.poll() is None:
                rank.send_signal(sig)

    def watch_for_preemption(self) -> None:
        check = notice_source(os.environ.get("VERI_WORKER_PREEMPTION_NOTICE"))
        if check:
            interval = float(os.environ.get("VERI_WORKER_NOTICE_POLL_SECONDS") or 5)
            PreemptionWatch(check, self.on_preemption, interval).start()

    def on_preemption(self, notice: Notice) -> None:
        """The machine is going away: the training process saves a checkpoint at the end of its
        current step (SIGUSR2, see worker.train), which is uploaded as any other; once the step
        after it is reported, the training pauses until the machine is gone (see
        `_pause_after_flush`)."""
        self.notice = notice
        when = f" at {notice.terminates_at}" if notice.terminates_at else ""
        self.say(
            f"[veri] {notice.source} warned that this machine goes away{when}: saving a "
            "checkpoint now"
        )
        try:
            self.api.call("POST", "/notice", json=notice._asdict())
        except ControlPlaneError as exc:
            self.say(f"[veri] could not report the notice: {exc}")
        self.signal_child(signal.SIGUSR2)

    def _pause_after_flush(self, step: int) -> None:
        """Steps trained after the flushed checkpoint would be lost with the machine, so the
        training waits (SIGSTOP) while the machine is taken away, and the job is restarted from
        that checkpoint elsewhere. Should the machine still be here a while after the time the
        provider gave, the notice was wrong and the training goes on."""
        if not self.child or self.child.poll() is not None:
            return
        grace = PAUSE_AFTER_NOTICE_SECONDS
        if self.notice and self.notice.terminates_at:
            try:
                until = datetime.fromisoformat(self.notice.terminates_at).timestamp()
                grace += max(0.0, until - time.time())
            except ValueError:
                pass
        self.paused = True
        self._signal_ranks(signal.SIGSTOP)
        self.say(f"[veri] checkpoint {step} holds the progress; training paused for the handover")
        timer = threading.Timer(grace, self._resume_after_false_notice)
        timer.daemon = True
        timer.start()

    def _resume_after_false_notice(self) -> None:
        if self.child and self.child.poll() is None:
            self.say("[veri] the machine was not taken away after all: training goes on")
            self.paused = False
            self._signal_ranks(signal.SIGCONT)

    def end_wandb(self, *, ok: bool) -> None:
        if self.wandb:
            self.wandb.finish(ok=ok)

    def finish(self, *, ok: bool, code: str | None = None, message: str = "") -> None:
        self.end_wandb(ok=ok)
        if self.shipper:
            self.shipper.close()
        body = {"ok": ok} if ok else {"ok": False, "error_code": code, "message": message}
        try:
            self.api.call("POST", "/complete", json=body)
        except ControlPlaneError as exc:
            print(f"[veri] could not report the result: {exc}", flush=True)

    def enter_phase(self, phase: str) -> None:
        """Tell the control plane which of the runner's phases the run is in: a platform fault is
        believed only from the runner's check of its own phase (see training.errors)."""
        self.api.call("POST", "/phase", json={"phase": phase})

    def report_timing(self, phase: str, **figures) -> None:
        """Tell the control plane when the run entered a start-up phase only the worker sees
        (the job's `timings`); shown to the user, so a failure to say it is only logged."""
        try:
            self.api.call("POST", "/timings", json={"phase": phase, **figures}, attempts=3)
        except ControlPlaneError as exc:
            print(f"[veri] could not report the {phase} time: {exc}", flush=True)

    def prepare(self, spec: dict, mounts: dict) -> dict:
        """The child's job file: the spec with local paths for data, model and resume point."""
        self.work.mkdir(parents=True, exist_ok=True)
        self.work.chmod(0o755)  # read by the training's user; written by the runner only
        job = dict(spec, output_dir=str(self.home / "output"), final_dir=str(self.home / "final"))
        for key in ("dataset", "validation_dataset"):
            if spec.get(key):
                job[key] = self.local_dataset(spec[key], mounts, self.work / f"{key}.jsonl")
        base = spec["base_model"]
        if base.startswith("volume://"):
            name, _, path = base.removeprefix("volume://").partition("/")
            job["model_path"] = str(mounts[name] / path)
        else:
            job["model_path"] = base  # a local folder, or a hub id when the worker has network
        if resume := spec.get("resume_from"):
            folder = Path(job["output_dir"]) / f"checkpoint-{resume['step']}"
            for file in resume["files"]:
                self.fetch(file["url"], folder / file["path"])
            job["resume_path"] = str(folder)
            self.say(f"[veri] resuming from {resume['checkpoint_id']} at step {resume['step']}")
        if adapter := spec.get("adapter_from"):
            folder = self.work / "adapter"
            for file in adapter["files"]:
                self.fetch(file["url"], folder / file["path"])
            job["adapter_path"] = str(folder)
            self.say(f"[veri] training on from the adapter of {adapter['checkpoint_id']}")
        sandbox.prepare_home(
            self.home, sandbox.training_uid(self.job_id) if sandbox.isolated() else None
        )
        return job

    def local_dataset(self, data: dict, mounts: dict, target: Path) -> dict:
        """A dataset's spec with the `local_path` the training reads: an upload fetched to
        `target`, a volume's file on its mount (a hub dataset is loaded by the training)."""
        data = dict(data)
        if data["source"] == "upload":
            self.fetch(data["url"], target)
            data["local_path"] = str(target)
        elif data["source"] == "volume":
            data["local_path"] = str(mounts[data["volume"]] / data["path"])
        return data

    def fetch(self, url: str, target: Path) -> None:
        download(self.http, url, target)

    def train(self, job: dict) -> None:
        """Run the training, one process per device (`gpu_count`), data-parallel: rank 0
        reports events and writes the job's log; the other ranks' last lines are kept for a
        failure. A hardware check runs before the training and again after it failed."""
        job_file = self.work / "job.json"
        job_file.write_text(json.dumps(job))
        world, device = job.get("gpu_count", 1), _device(job)
        checked = world > 1 or device == "cuda"
        self.enter_phase("hardware")
        if problem := sandbox.missing_sandbox():
            raise JobFailure("hardware_error", f"this machine cannot run the job: {problem}")
        if checked:
            if found := check_hardware(device, world):
                raise JobFailure(found.code, f"the hardware check failed: {found.message}")
            self.say(f"[veri] hardware check passed: {world} {device} rank(s), devices and link")
        if problem := self.sandbox_problem(job):
            raise JobFailure("hardware_error", f"this machine cannot run the job: {problem}")
        read_fd, write_fd = os.pipe()
        port = _free_port()
        self.enter_phase("training")  # customer code from here on
        self.ranks = [
            self._start_rank(rank, world, port, job, job_file, write_fd) for rank in range(world)
        ]
        self.child = self.ranks[0]
        os.close(write_fd)
        outcome: dict = {}
        tails = [deque(maxlen=TAIL_LINES) for _ in range(world)]
        readers = [threading.Thread(target=self._pump_output, args=(self.child,), daemon=True)]
        readers += [
            threading.Thread(target=_keep_tail, args=(self.ranks[r], tails[r]), daemon=True)
            for r in range(1, world)
        ]
        if world > 1:
            readers.append(threading.Thread(target=self._watch_ranks, daemon=True))
        for reader in readers:
            reader.start()
        try:
            with os.fdopen(read_fd, errors="replace") as events:
                for raw in events:
                    self._on_event(_parse_event(raw), outcome)
        finally:
            if not outcome:  # the runner gave up: stop the training too
                self._kill_ranks()
        statuses = [self.child.wait(), *map(_wait_or_kill, self.ranks[1:])]
        for reader in readers:
            reader.join()
        self.enter_phase("finishing")  # no customer code runs any more
        failure = self._failure(outcome, statuses)
        if failure:
            for rank in range(1, world):
                self.say(f"[veri] the last lines of rank {rank}:")
                for line in tails[rank]:
                    self.say(f"[rank {rank}] {line}")
            if checked and (found := check_hardware(device, world)):
                raise JobFailure(
                    "hardware_error",
                    f"{failure.message}; then the hardware check failed: {found.message}",
                )
            raise failure
        job["final_step"] = outcome.get("finished", {}).get("step", 0)

    def _start_rank(
        self, rank: int, world: int, port: int, job: dict, job_file: Path, events_fd: int
    ) -> subprocess.Popen:
        extra = _rank_env(rank, world, port)
        if rank == 0:
            extra["VERI_EVENTS_FD"] = str(events_fd)
        argv = [sys.executable, "-P", "-m", "worker.train", str(job_file)]
        return self._sandboxed(argv, job, extra, (events_fd,) if rank == 0 else ())

    def _sandboxed(
        self, argv: list[str], job: dict, extra: dict, pass_fds: tuple[int, ...] = ()
    ) -> subprocess.Popen:
        return sandbox.start(
            argv,
            job_id=self.job_id,
            home=self.home,
            readable=[self.work, self.mount_root, *filter(None, [sandbox.hub_cache()])],
            cuda=_device(job) == "cuda",
            env=sandbox.training_env(self.home, extra),
            pass_fds=pass_fds,
        )

    def sandbox_problem(self, job: dict) -> str | None:
        """Why the sandbox customer code runs in cannot start on this machine (a container
        that refuses user namespaces, say), found by starting it around nothing: the
        platform's fault, never the training's."""
        try:
            probe = self._sandboxed([sys.executable, "-P", "-c", "pass"], job, {})
            output, _ = probe.communicate(timeout=HARDWARE_CHECK_SECONDS)
        except OSError as exc:
            return f"the sandbox for customer code cannot start here: {exc}"
        except subprocess.TimeoutExpired:
            probe.kill()
            return f"the sandbox did not start within {HARDWARE_CHECK_SECONDS} s"
        if probe.returncode:
            text = output.decode(errors="replace").strip()[-500:]
            return f"the sandbox for customer code cannot start here ({probe.returncode}): {text}"
        return None

    def _kill_ranks(self) -> None:
        for rank in self.ranks:
            if rank.poll() is None:
                rank.kill()

    def _watch_ranks(self) -> None:
        """A rank that died leaves the others waiting in a collective: after a grace period
        (their own collective errors usually end them sooner) they are stopped, and the first
        rank lost is what the job's error names. A training whose ranks all live but that
        makes no progress for the stall window is stopped too, each rank's stack in the log."""
        while True:
            time.sleep(0.5)
            ended = [rank.poll() for rank in self.ranks]  # every rank's, each time
            if None not in ended:
                return
            lost = [(r, status) for r, status in enumerate(ended) if status]
            if lost and not self.lost_rank:
                self.lost_rank = lost[0]
                deadline = time.monotonic() + LOST_RANK_GRACE_SECONDS
                while time.monotonic() < deadline and any(p.poll() is None for p in self.ranks):
                    time.sleep(0.2)
                self._kill_ranks()
                return
            if not (self.paused or self.saving) and self._stalled():
                self.stalled = True
                for rank in self.ranks:  # faulthandler prints every thread's stack (worker.train)
                    if rank.poll() is None:
                        rank.send_signal(signal.SIGQUIT)
                time.sleep(2)
                self._kill_ranks()
                return

    def _stalled(self) -> bool:
        """No step for the longer of the stall window and three times the median step time
        (after the first step: loading a large model is not a stall)."""
        if not self.step_times:
            return False
        times = list(self.step_times)
        gaps = [later - earlier for earlier, later in zip(times, times[1:], strict=False)]
        window = max(STALL_SECONDS, 3 * statistics.median(gaps)) if gaps else STALL_SECONDS
        return time.monotonic() - self.step_times[-1] > window

    def _failure(self, outcome: dict, statuses: list[int]) -> JobFailure | None:
        if "error" in outcome:
            code, message = outcome["error"]["code"], outcome["error"]["message"]
            if code not in TRAINING_CODES:
                # Customer code runs in that process: what it says cannot be a platform fault.
                return JobFailure(
                    "training_error",
                    f"the training process reported {code!r}, which only the platform's own "
                    f"checks report; it counts as the training's own error: {message}",
                )
            return JobFailure(code, message)
        if "stopped" in outcome and self.stop:
            step = outcome["stopped"]["step"]
            return JobFailure(self.stop["code"], f"{self.stop['message']} Stopped at step {step}.")
        if "finished" in outcome and statuses[0] == 0:
            return None  # the model is saved; a rank stopped after that changes nothing
        if self.stalled:
            return JobFailure(
                "training_stalled",
                f"no training step for {int(time.monotonic() - self.step_times[-1])} s with "
                f"all {len(self.ranks)} ranks alive (last step {self.last_step}); each rank's "
                "stack is in the log",
            )
        if self.lost_rank:
            rank, status = self.lost_rank
            return JobFailure(
                "distributed_error",
                f"rank {rank} of {len(self.ranks)} {_how_it_ended(status)} while the others "
                f"trained (last step {self.last_step}); the others were stopped",
            )
        if statuses[0] != 0:
            return JobFailure(
                "training_error", f"the training process {_how_it_ended(statuses[0])}"
            )
        return None

    def _pump_output(self, child: subprocess.Popen) -> None:
        for raw in iter(child.stdout.readline, b""):
            text = raw.decode("utf-8", "replace").rstrip("\n")
            print(text, flush=True)
            self.shipper.line(text)

    def _on_event(self, event: dict, outcome: dict) -> None:
        kind = event["event"]
        if kind == "loaded":
            self.report_timing("model_loaded")
        elif kind == "running":
            self._child_listens()
            self.api.call("POST", "/status", json={"status": "running"})
        elif kind == "step":
            if self.last_step is None:
                self.report_timing("first_step")
            self.shipper.set_step(event["step"])
            self.last_step = event["step"]
            self.step_times.append(time.monotonic())
        elif kind == "saving":  # however long a save takes, it is not a stall
            self.saving = True
        elif kind == "metrics":
            self.shipper.metrics(event["step"], event["values"])
            if self.wandb:
                self.wandb.log(event["step"], event["values"])
            if self.flushed is not None and event["step"] > self.flushed:
                self._pause_after_flush(self.flushed)
                self.flushed = None
        elif kind == "samples":
            self.shipper.samples(event["step"], event["samples"])
        elif kind == "checkpoint":
            self.saving = False
            self.step_times.append(time.monotonic())
            # The folder is where the training saves (see worker.train), never a path it names.
            name = f"checkpoint-{event['step']}"
            try:
                self.upload_checkpoint(
                    ("outbox", name),
                    event["step"],
                    f"checkpoints/step-{event['step']:08d}",
                    final=False,
                )
            except (JobFailure, ControlPlaneError, OSError) as failure:
                # The job goes on; the final upload decides.
                reason = failure.message if isinstance(failure, JobFailure) else repr(failure)
                self.say(f"[veri] checkpoint {event['step']} was not saved: {reason}")
            else:
                if event.get("flush"):
                    # Paused once the next step is reported too: the restarted run replays that
                    # step, and its check needs this run's value of it.
                    self.flushed = event["step"]
            finally:
                shutil.rmtree(self.home / "outbox" / name, ignore_errors=True)
        elif kind in END_KINDS:
            with self.signals_lock:
                self.child_signals = "over"
            outcome[kind] = event

    def upload_checkpoint(self, parts: tuple[str, ...], step: int, remote: str, *, final: bool):
        """Upload the training's folder `home/parts…` as a checkpoint (or the final model). What
        the folder holds is the training's doing: files the control plane refuses (their names,
        their number) are the training's error; a store refusing the bytes is the platform's
        (`upload_failed`)."""
        try:
            files, skipped = outputs.open_files(self.home, *parts)
        except outputs.Unreadable as exc:
            raise JobFailure(
                "training_error", f"the training's output cannot be saved: {exc}"
            ) from exc
        try:
            for path in skipped:
                self.say(f"[veri] not saved: {'/'.join(parts)}/{path} is not a regular file")
            self._upload_files(files, step, remote, final=final)
        finally:
            outputs.close_all(files)

    def _upload_files(self, files: list, step: int, remote: str, *, final: bool) -> None:
        # Signed with each file's sha256: the store refuses bytes that changed on the way.
        try:
            answer = self.api.call(
                "POST",
                "/output-credentials",
                json={"files": [{"path": f"{remote}/{f.path}", "sha256": f.sha256} for f in files]},
            )
        except ControlPlaneError as exc:
            if exc.status != 400:
                raise
            raise JobFailure(
                "training_error", f"the training wrote files that cannot be saved: {exc}"
            ) from exc
        failures: dict[str, str] = {}

        def put(item) -> None:
            file, target = item
            try:
                headers = {**target["headers"], "Content-Type": "application/octet-stream"}
                for _attempt in range(4):
                    with outputs.body(file) as body:
                        response = self.http.put(
                            target["url"],
                            content=body,
                            headers={**headers, "Content-Length": str(file.size)},
                        )
                    if response.status_code < 500:
                        break
                response.raise_for_status()
            except httpx.HTTPError as exc:
                reason = (
                    f"HTTP {exc.response.status_code}"
                    if isinstance(exc, httpx.HTTPStatusError)
                    else type(exc).__name__
                )
                failures[target["path"]] = f"{reason}: {exc}"[:300]

        with ThreadPoolExecutor(8) as pool:
            list(pool.map(put, zip(files, answer["files"], strict=True)))
        if failures:
            listed = "; ".join(f"{path}: {why}" for path, why in sorted(failures.items()))
            raise JobFailure("upload_failed", f"could not upload {len(failures)} file(s): {listed}")
        self.api.call(
            "POST",
            "/checkpoints",
            json={
                "step": step,
                "final": final,
                "files": [{"path": f.path, "size": f.size, "sha256": f.sha256} for f in files],
            },
        )
        self.say(
            f"[veri] {'final model' if final else f'checkpoint {step}'} saved ({len(files)} files)"
        )

    def upload_final(self, job: dict) -> None:
        final = Path(job["final_dir"])
        (final / "training_args.bin").unlink(missing_ok=True)  # a pickle; not part of the model
        self.upload_checkpoint(("final",), job["final_step"], "final", final=True)


def _bytes_under(folders: set[Path]) -> int:
    return sum(f.stat().st_size for folder in folders for f in folder.rglob("*") if f.is_file())


def registration() -> dict:
    """What the worker tells the control plane when it comes up: its build (refused unless it
    is the control plane's own) and how the machine's bootstrap installed it (VERI_BOOTSTRAP,
    `key=value` pairs, set by providers/templates/providers/bootstrap.sh)."""
    info = {"hostname": platform.node(), "python": platform.python_version(), "build": build_id()}
    if report := os.environ.get("VERI_BOOTSTRAP"):
        info["bootstrap"] = dict(pair.partition("=")[::2] for pair in report.split())
    return info


def run(*, job_id: str, api_url: str) -> int:
    # Kept by the runner alone: no process it starts inherits it.
    token = os.environ.pop("VERI_JOB_TOKEN", None)
    if not token:
        print("VERI_JOB_TOKEN is not set", file=sys.stderr)
        return 2
    work = Path(os.environ.get("VERI_WORK_DIR") or tempfile.mkdtemp(prefix="veri-"))
    mount_root = Path(os.environ.get("VERI_MOUNT_ROOT") or "/mnt")
    try:
        return Runner(
            job_id=job_id, api_url=api_url, token=token, work_dir=work, mount_root=mount_root
        ).run()
    finally:
        shutil.rmtree(work / "home", ignore_errors=True)
