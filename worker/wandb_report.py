"""A job's Weights & Biases run, kept by the runner: the training process reports metrics to the
runner (events on a pipe), and the runner logs them to W&B. The workspace's W&B key reaches the
runner in its spec and goes from there to `wandb.init`'s settings only: never into os.environ
(the training's environment is allow-listed anyway, see worker.sandbox), never into the job file
the training reads, never into a log line, never into the machine's ~/.netrc (`wandb.login`
would write it there, so it is not called). W&B's files go to the work folder's `wandb/`, which
only the runner can read. W&B is the customer's convenience, not the job: every call to it runs
in a thread of its own (an unreachable W&B takes a minute and a half to give up), and any
failure of it is one log line; training goes on."""

import queue
import threading
from collections.abc import Callable
from pathlib import Path

KEY = "WANDB_API_KEY"
# How long the end of a job waits for W&B to take its last rows: the machine costs money.
FINISH_WAIT_SECONDS = 60
# Rows waiting for a slow W&B, at most: the training decides how many it reports.
MAX_WAITING_ROWS = 10_000


def wandb_settings(spec: dict) -> dict | None:
    """The job's W&B integration (project, name, entity, tags), if it has one."""
    for integration in spec.get("integrations") or []:
        if integration.get("type") == "wandb":
            return integration["wandb"]
    return None


class WandbRun:
    def __init__(self, spec: dict, *, key: str | None, work: Path, say: Callable[[str], None]):
        self.spec, self.key, self.folder, self.say = spec, key, work / "wandb", say
        self.rows: queue.Queue = queue.Queue(maxsize=MAX_WAITING_ROWS)  # (step, values)
        self.ending, self.dropping = threading.Event(), False
        self.exit_code = 1
        self.thread = threading.Thread(target=self._serve, name="wandb", daemon=True)

    @classmethod
    def start(
        cls, spec: dict, *, key: str | None, work: Path, say: Callable[[str], None]
    ) -> "WandbRun | None":
        """The job's W&B run, starting in its thread; None when the job has no W&B integration."""
        if wandb_settings(spec) is None:
            return None
        run = cls(spec, key=key, work=work, say=say)
        run.thread.start()
        return run

    def log(self, step: int, values: dict) -> None:
        numbers = {
            k: v
            for k, v in values.items()
            if isinstance(v, int | float) and not isinstance(v, bool)
        }
        if not numbers:
            return
        try:
            self.rows.put_nowait((step, numbers))
        except queue.Full:
            if not self.dropping:
                self.dropping = True
                self.say(f"[veri] W&B: {MAX_WAITING_ROWS} rows wait for W&B; dropping rows")

    def finish(self, *, ok: bool) -> None:
        """End the run (exit code 0 or 1), waiting a while for W&B to take the last rows."""
        if not self.thread.is_alive():
            return
        self.exit_code = 0 if ok else 1
        self.ending.set()
        self.thread.join(FINISH_WAIT_SECONDS)
        if self.thread.is_alive():
            self.say(f"[veri] W&B: still busy after {FINISH_WAIT_SECONDS} s; not waiting longer")

    def _serve(self) -> None:
        run = self._init()
        while True:
            try:
                step, values = self.rows.get(timeout=0.2)
            except queue.Empty:
                if self.ending.is_set():  # and every row before the end is logged
                    break
                continue
            if run is None:
                continue
            try:
                run.log(values, step=step)
            except Exception as exc:  # noqa: BLE001 - W&B failing never fails the job
                self.say(f"[veri] W&B: stopped logging at step {step}: {self._scrub(exc)}")
                self._end(run, exit_code=1)
                run = None
        if run is not None:
            self._end(run, exit_code=self.exit_code)

    def _init(self):
        wanted, spec = wandb_settings(self.spec), self.spec
        mode = spec.get("wandb_mode") or "online"
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            self.folder.chmod(0o700)  # the runner's: the training's user cannot read it
            import wandb  # noqa: PLC0415 - only jobs with the integration need it installed

            run = wandb.init(
                project=wanted["project"],
                name=wanted.get("name") or spec["job_id"],
                entity=wanted.get("entity"),
                tags=wanted.get("tags") or None,
                config={
                    "veri_job_id": spec["job_id"],
                    "method": spec["method"],
                    "base_model": spec["base_model"],
                    "attempt": spec.get("attempt"),
                    "lora": spec.get("lora"),
                    **(spec.get("hyperparameters") or {}),
                },
                dir=str(self.folder),
                mode=mode,
                reinit="create_new",
                settings=wandb.Settings(
                    api_key=self.key if mode == "online" else None,
                    silent=True,
                    console="off",  # the job's log is Veri's; W&B gets metrics only
                    save_code=False,
                    disable_git=True,
                    x_disable_stats=True,  # the runner's machine stats are not the training's
                    x_disable_meta=True,
                ),
            )
        except Exception as exc:  # noqa: BLE001 - an import error, the network, a refused key
            self.say(f"[veri] W&B: not logging this job: {self._scrub(exc)}")
            return None
        self.say(f"[veri] W&B: logging metrics to {run.project} ({mode})")
        return run

    def _end(self, run, *, exit_code: int) -> None:
        try:
            run.finish(exit_code=exit_code)
        except Exception as exc:  # noqa: BLE001
            self.say(f"[veri] W&B: the run did not finish cleanly: {self._scrub(exc)}")

    def _scrub(self, exc: Exception) -> str:
        """The error, on one line, without the key should an error message quote it."""
        text = f"{type(exc).__name__}: {exc}".replace("\n", " ")[:300]
        return text.replace(self.key, "***") if self.key else text
