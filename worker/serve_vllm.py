"""A replica's vLLM, on a rented GPU machine (`python -m worker serve … --engine vllm`): with the
base model and adapters fetched as the CPU engine fetches them, start vLLM's OpenAI-compatible
server with LoRA enabled on every interface, on a port of PORTS (those the provider opened to the
control plane at launch), requiring the replica's serving key (`--api-key`: only the router holds
it); wait for its `/health`, report ready with its port, heartbeat while it lives, and report it
failed with its last output lines when it exits.

The machine's bootstrap installs vLLM (the control plane's VERI_VLLM_REQUIREMENT) in a virtualenv
of its own and puts its `vllm` on PATH. A model vLLM cannot load is the customer's
`model_load_error`; vLLM dying once it served is the platform's `replica_failed`. Never with
`--trust-remote-code`: a base model's own code is not run here. Its launcher (`Server`) and rank
rule also start a Tinker model's sampler (worker/tinker_vllm.py)."""

import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from pathlib import Path

import httpx

from worker.client import ControlPlane, ControlPlaneError, heartbeat

# vLLM's choices for --max-lora-rank (vllm/config/lora.py, MaxLoRARanks): the smallest that holds
# every adapter's rank is taken.
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
TAIL_LINES = 40  # of vLLM's output, sent with a failure
POLL_SECONDS = 0.5
PR_SET_PDEATHSIG = 1  # prctl(2)
STOP_SECONDS = 30  # how long vLLM gets to exit on SIGTERM before it is killed
MAX_MESSAGE = 10_000  # the control plane's limit on a failure's message
# The ports a replica on a rented machine serves on: the providers open these to the control
# plane, and the control plane accepts a ready report only on one of them.
PORTS = range(8000, 8010)
# A refused ready report (the provider reports no address for the machine yet) is sent again
# this long after, until the control plane's start timeout ends the replica (tests shorten it).
READY_RETRY_SECONDS = float(os.environ.get("VERI_REPLICA_READY_RETRY_SECONDS") or 15)


def max_lora_rank(adapters: dict[str, Path]) -> int:
    """The smallest rank vLLM offers that holds each adapter's `r` (its adapter_config.json)."""
    biggest = 0
    for name, folder in adapters.items():
        config = json.loads((folder / "adapter_config.json").read_text())
        rank = config.get("r")
        if not isinstance(rank, int) or rank < 1:
            raise ValueError(f"adapter {name}: adapter_config.json has no LoRA rank `r`")
        biggest = max(biggest, rank)
    return fitting_rank(biggest)


def fitting_rank(rank: int) -> int:
    """The smallest of vLLM's --max-lora-rank choices that holds `rank`."""
    fitting = [r for r in LORA_RANKS if r >= rank]
    if not fitting:
        raise ValueError(f"a LoRA rank of {rank} is above vLLM's largest, {LORA_RANKS[-1]}")
    return fitting[0]


def lora_module(name: str, folder: Path) -> str:
    """One `--lora-modules` item: `name=path`, or vLLM's JSON form for a name holding `=`."""
    if "=" in name:
        return json.dumps({"name": name, "path": str(folder)})
    return f"{name}={folder}"


def command(
    *,
    base: str | Path,
    served_name: str,
    adapters: dict[str, Path],
    port: int,
    key: str,
    tensor_parallel_size: int,
    max_loras: int,
) -> list[str]:
    """`vllm serve` for the base (a folder, or a hub id vLLM fetches), served under the
    deployment's base name, each adapter under its own name, on every interface (the router
    calls it from the control plane) behind the serving key."""
    args = [
        "vllm",
        "serve",
        str(base),
        "--host",
        "0.0.0.0",  # noqa: S104 - the router is on another machine; the key guards it
        "--port",
        str(port),
        "--api-key",
        key,
        "--served-model-name",
        served_name,
        "--tensor-parallel-size",
        str(tensor_parallel_size),
    ]
    if adapters:
        args += [
            "--enable-lora",
            "--max-loras",
            str(max_loras),
            "--max-lora-rank",
            str(max_lora_rank(adapters)),
            "--lora-modules",
            *(lora_module(name, folder) for name, folder in adapters.items()),
        ]
    return args


def free_port() -> int | None:
    """The first of PORTS nothing listens on, or None."""
    for port in PORTS:
        with socket.socket() as probe:
            try:
                probe.bind(("0.0.0.0", port))  # noqa: S104 - where vLLM will listen
            except OSError:
                continue
            return port
    return None


def healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def _report(api: ControlPlane, path: str, body: dict) -> bool:
    """False when the control plane no longer knows the replica (it was stopped meanwhile)."""
    try:
        api.call("POST", path, json=body, attempts=5)
    except ControlPlaneError as exc:
        if exc.status in (401, 403, 404):
            return False
        raise
    return True


def _end_with_parent() -> None:
    """(In vLLM's process, before it starts) SIGTERM when this serving process dies, however it
    dies: a killed worker leaves no vLLM serving, or holding its port, behind."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


class Server:
    """vLLM's server (`args`), a child of this process that ends with it: its output relayed
    into the machine's log, its last TAIL_LINES kept for a failure. `key` (its --api-key) is
    never logged; `env` is added to this process's environment for it."""

    def __init__(self, args: list[str], *, key: str, env: dict[str, str] | None = None):
        print(f"[veri] starting {' '.join(args).replace(key, '***')}", flush=True)
        self.child = subprocess.Popen(
            args,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            preexec_fn=_end_with_parent,
            env={**os.environ, **env} if env else None,
        )
        self.tail: deque[str] = deque(maxlen=TAIL_LINES)
        self.reader = threading.Thread(target=self._relay, daemon=True)
        self.reader.start()

    def _relay(self) -> None:
        for line in self.child.stdout:
            self.tail.append(line)
            sys.stderr.write(line)

    def exited(self) -> bool:
        return self.child.poll() is not None

    def failure(self, when: str) -> str:
        """(Once it exited) what a failure report says: its status and its last lines."""
        self.reader.join(5)
        head = f"vLLM exited with status {self.child.returncode} {when}. Its last lines:\n"
        return head + "".join(self.tail)[-(MAX_MESSAGE - len(head)) :]

    def stop(self) -> None:
        if self.child.poll() is None:
            self.child.terminate()
            try:
                self.child.wait(STOP_SECONDS)
            except subprocess.TimeoutExpired:
                self.child.kill()
                self.child.wait()


def run(
    api: ControlPlane,
    *,
    base: str | Path,
    served_name: str,
    adapters: dict[str, Path],
    key: str,
    tensor_parallel_size: int,
    max_loras: int,
    heartbeat_seconds: float,
    silent_seconds: float,
) -> int:
    if shutil.which("vllm") is None:  # the bootstrap's install went missing: not the customer's
        _report(
            api,
            "/failed",
            {"code": "provisioning_error", "message": "vLLM is not installed (no `vllm` on PATH)."},
        )
        return 1
    port = free_port()
    if port is None:
        message = f"No free serving port in {PORTS.start}-{PORTS.stop - 1} on the machine."
        _report(api, "/failed", {"code": "provisioning_error", "message": message})
        return 1
    try:
        args = command(
            base=base,
            served_name=served_name,
            adapters=adapters,
            port=port,
            key=key,
            tensor_parallel_size=tensor_parallel_size,
            max_loras=max_loras,
        )
    except (OSError, ValueError) as exc:  # an adapter without a readable config
        _report(api, "/failed", {"code": "model_load_error", "message": str(exc)[:MAX_MESSAGE]})
        return 1
    server = Server(args, key=key)
    url, ready = f"http://127.0.0.1:{port}", False
    next_ready = time.monotonic()
    heard = time.monotonic()
    next_beat = heard + heartbeat_seconds
    try:
        while True:
            if server.exited():
                message = server.failure("after serving" if ready else "while loading the model")
                code = "replica_failed" if ready else "model_load_error"
                _report(api, "/failed", {"code": code, "message": message})
                return 1
            if not ready and time.monotonic() >= next_ready and healthy(url):
                try:
                    if not _report(api, "/ready", {"url": url}):
                        return 0
                    ready = True
                    print(f"[veri] vLLM serves {served_name} and {sorted(adapters)} on port {port}")
                except ControlPlaneError as exc:  # e.g. no address for the machine yet
                    if exc.status != 400:
                        raise
                    print(f"[veri] ready report refused, asking again: {exc}", flush=True)
                    next_ready = time.monotonic() + READY_RETRY_SECONDS
            if time.monotonic() >= next_beat:  # also while loading: a stopped replica ends it
                if (heard := heartbeat(api, heard, silent_seconds)) is None:
                    return 0
                next_beat = time.monotonic() + heartbeat_seconds
            time.sleep(POLL_SECONDS)
    finally:
        server.stop()
