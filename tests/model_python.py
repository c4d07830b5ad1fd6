"""One Python process per test process for the suite's model checks (load an adapter with
transformers and PEFT, generate): torch, transformers and PEFT take 4 CPU-seconds to import, and a
fresh interpreter for each check paid them again. The test process itself still never imports
torch. `run(script, *args)` runs the script there as `python -c script *args` would in the
caller's folder, with a fresh `__main__`, and answers what that would have."""

import atexit
import contextlib
import io
import json
import os
import subprocess
import sys
import threading
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
_lock = threading.Lock()
_process: subprocess.Popen | None = None


def run(script: str, *args: str) -> subprocess.CompletedProcess:
    global _process
    with _lock:
        if _process is None or _process.poll() is not None:
            _process = subprocess.Popen(
                [sys.executable, "-m", "tests.model_python"],
                cwd=REPO,
                env={**os.environ, "HF_HUB_OFFLINE": "1"},
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            atexit.register(_process.kill)
        asked = {"script": script, "argv": ["-c", *args], "cwd": os.getcwd()}
        _process.stdin.write(json.dumps(asked) + "\n")
        _process.stdin.flush()
        answer = _process.stdout.readline()
    if not answer:
        raise AssertionError(f"the model checks' process ended ({_process.wait()})")
    done = json.loads(answer)
    return subprocess.CompletedProcess(["-c", script, *args], **done)


def _serve() -> None:
    import peft  # noqa: F401 - imported once, for every script after
    import torch  # noqa: F401
    import transformers  # noqa: F401

    answers = sys.stdout
    for line in sys.stdin:
        asked = json.loads(line)
        out, err, code = io.StringIO(), io.StringIO(), 0
        sys.argv = asked["argv"]
        os.chdir(asked["cwd"])
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                exec(compile(asked["script"], "<string>", "exec"), {"__name__": "__main__"})
            except SystemExit as exit:
                code = exit.code if isinstance(exit.code, int) else (exit.code is not None)
            except BaseException:
                traceback.print_exc()
                code = 1
        reply = {"returncode": code, "stdout": out.getvalue(), "stderr": err.getvalue()}
        answers.write(json.dumps(reply) + "\n")
        answers.flush()


if __name__ == "__main__":
    _serve()
