"""A grader scored in a child process, for the control plane: `run` (the parent's side, behind
`worker.graders.run_isolated`) starts `python -m worker.grader_run` (`main`, the child's side),
sandboxed as the training process is when the control plane runs as root (worker/sandbox.py: its
own user id, its own process and network namespaces, only the system, Python and the worker
package visible), always with an empty environment but what Python needs, a wall-clock timeout,
and limits on memory, CPU time, file size, processes and output. Run by another user, there is
no user or network separation: the limits and the empty environment remain.

The grader, sample and item go in as JSON on stdin; `{"result": <worker.graders.score's dict>}`
comes back on stdout. The child limits itself before any customer code runs and moves file
descriptor 1 away, so what the grader prints goes to stderr (the parent keeps its tail) and only
`main` writes the answer; the parent still checks every part of it, since customer code could
have written it.
"""

import argparse
import contextlib
import json
import math
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import uuid
from pathlib import Path

import worker
from worker import graders, sandbox

MEMORY = 2 * 1024**3
PROCESSES = 64  # threads count too: enough for numpy's, not for a fork bomb
FILE_BYTES = 64 * 1024 * 1024
OUTPUT = 1024 * 1024
LOG = 4096  # the tail of its stderr kept for an error's details
UNSANDBOXED = "VERI_GRADERS_UNSANDBOXED"


def _failed(flag: str, message: str, **details: str) -> dict:
    errors = dict(graders.NO_ERRORS, **{flag: True}, **details)
    return {"reward": 0.0, "sub_rewards": {}, "errors": errors, "error": message}


def _runtime_error(message: str, **flags: bool) -> dict:
    result = _failed("python_grader_runtime_error", message)
    result["errors"].update(flags, python_grader_runtime_error_details=message)
    return result


def _exchange(
    process: subprocess.Popen, payload: bytes, timeout: float
) -> tuple[bytes, bytes, str | None]:
    """Feed `payload` to the child, read its stdout (bounded) and its stderr's tail; why it was
    killed ("timeout", "output") or None."""
    output, log = bytearray(), bytearray()
    why: list[str] = []

    def kill(reason: str) -> None:
        why.append(reason)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)  # its group; in bwrap, its namespace ends too

    def feed() -> None:
        with contextlib.suppress(OSError):
            process.stdin.write(payload)
            process.stdin.close()

    def read_output() -> None:
        while chunk := process.stdout.read1(65536):
            if len(output) + len(chunk) > OUTPUT:
                kill("output")
                return
            output.extend(chunk)

    def read_log() -> None:
        while chunk := process.stderr.read1(65536):
            log.extend(chunk)
            del log[:-LOG]

    threads = [threading.Thread(target=t, daemon=True) for t in (feed, read_output, read_log)]
    for thread in threads:
        thread.start()
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        kill("timeout")
        process.wait()
    for thread in threads:
        thread.join(timeout=2)
    return bytes(output), bytes(log), (why[0] if why else None)


def _checked_result(output: bytes) -> dict | None:
    """The child's answer, rebuilt from checked parts (customer code could have written it)."""
    try:
        answer = json.loads(output)["result"]
        reward = answer["reward"]
        subs = answer["sub_rewards"]
        errors = {key: answer["errors"][key] for key in graders.NO_ERRORS}
        error = answer["error"]
    except (ValueError, TypeError, KeyError):
        return None
    plain = all(isinstance(v, bool | str | None) for v in errors.values())
    numbers = [reward, *subs.values()] if isinstance(subs, dict) else [None]
    if (
        not plain
        or not isinstance(error, str | None)
        or not all(
            isinstance(n, int | float) and not isinstance(n, bool) and math.isfinite(n)
            for n in numbers
        )
    ):
        return None
    subs = {str(k): float(v) for k, v in subs.items()}
    return {"reward": float(reward), "sub_rewards": subs, "errors": errors, "error": error}


def _unsandboxed_code(grader: dict) -> str | None:
    """Why a grader's code may not run here: the control plane serves every workspace, and a
    child run as its own user without the sandbox could read its environment and files (the
    parent's /proc/<pid>/environ: the secret key, the database's password) and reach its
    network. Development machines opt in with VERI_GRADERS_UNSANDBOXED=1."""
    if not graders.runs_code(grader) or sandbox.isolated():
        return None
    if os.environ.get(UNSANDBOXED) == "1":
        return None
    return (
        "the control plane does not run as root, so a grader's code could not be kept away "
        f"from its secrets (set {UNSANDBOXED}=1 on a development machine only)"
    )


def unavailable(grader: dict) -> str | None:
    """Why `run` could not score `grader` on this machine (it would answer a server error for
    every sample), or None."""
    return sandbox.missing_sandbox() or _unsandboxed_code(grader)


def run(grader: dict, *, sample: dict, item: dict, timeout: float) -> dict:
    """worker.graders.run_isolated's work, for a checked grader: this module as a child."""
    if problem := unavailable(grader):
        return _failed(
            "python_grader_server_error",
            f"Python graders cannot run here: {problem}.",
            python_grader_server_error_type="sandbox_unavailable",
        )
    payload = json.dumps({"grader": grader, "sample": sample, "item": item}).encode()
    home = Path(tempfile.mkdtemp(prefix="veri-grader-"))
    try:
        uid = sandbox.training_uid(f"grader-{uuid.uuid4().hex}") if sandbox.isolated() else None
        sandbox.prepare_home(home, uid)
        env = {
            "PATH": "/usr/bin:/bin",
            "LANG": "C.UTF-8",
            "HOME": str(home),
            "TMPDIR": str(home / "tmp"),
            "PYTHONPATH": str(Path(worker.__file__).parent.parent),
            "PYTHONDONTWRITEBYTECODE": "1",
            "PYTHONIOENCODING": "utf-8",
        }
        argv = [sys.executable, "-P", "-m", "worker.grader_run"]
        argv += ["--memory", str(MEMORY), "--cpu-seconds", str(math.ceil(timeout) + 1)]
        if uid is not None:
            argv += ["--processes", str(PROCESSES)]
            argv = sandbox.bwrap_command(
                argv, uid=uid, home=home, readable=[], cuda=False, network=False
            )
        try:
            process = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=env,
                cwd=home,
                start_new_session=True,
            )
        except OSError as exc:
            return _failed(
                "python_grader_server_error",
                f"The python grader's sandbox did not start: {exc}.",
                python_grader_server_error_type="sandbox_unavailable",
            )
        with process:
            output, log, why = _exchange(process, payload, timeout)
    finally:
        shutil.rmtree(home, ignore_errors=True)
    tail = log.decode("utf-8", "replace").strip()[-1000:]
    if why == "timeout":
        return _runtime_error(
            f"The python grader did not finish within {timeout:g} s.",
            unresponsive_reward_error=True,
        )
    if why == "output":
        return _runtime_error(f"The python grader wrote more than {OUTPUT} bytes.")
    if process.returncode != 0 or (result := _checked_result(output)) is None:
        code = process.returncode
        ended = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
        return _runtime_error(
            f"The python grader's process {ended} without a score" + (f": {tail}" if tail else ".")
        )
    return result


def limit(*, memory: int, cpu_seconds: int, processes: int | None) -> None:
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds))
    resource.setrlimit(resource.RLIMIT_FSIZE, (FILE_BYTES, FILE_BYTES))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if processes is not None:  # per user: only in the sandbox, where the user is this run's own
        resource.setrlimit(resource.RLIMIT_NPROC, (processes, processes))


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m worker.grader_run")
    parser.add_argument("--memory", type=int, required=True)
    parser.add_argument("--cpu-seconds", type=int, required=True)
    parser.add_argument("--processes", type=int)
    args = parser.parse_args()
    limit(memory=args.memory, cpu_seconds=args.cpu_seconds, processes=args.processes)
    request = json.load(sys.stdin.buffer)
    answer = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    result = graders.score(request["grader"], sample=request["sample"], item=request["item"])
    sys.stdout.flush()
    answer.write(json.dumps({"result": result}))
    answer.close()
    os._exit(0)  # the grader's threads and atexit handlers do not get a say


if __name__ == "__main__":
    main()
