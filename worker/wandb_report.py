"""A job's Weights & Biases run, kept by the runner: the training process reports metrics to the
runner (events on a pipe), and the runner logs them to W&B. The workspace's W&B key reaches the
runner in its spec and goes from there to `wandb.init`'s settings only: never into os.environ
(the training's environment is allow-listed anyway, see worker.sandbox), never into the job file
the training reads, never into a log line, never into the machine's ~/.netrc (`wandb.login`
would write it there, so it is not called). W&B's files go to the work folder's `wandb/`, which
only the runner can read. W&B is the customer's convenience, not the job: any failure of it is
one log line, and training goes on."""

from collections.abc import Callable
from pathlib import Path

KEY = "WANDB_API_KEY"


def wandb_settings(spec: dict) -> dict | None:
    """The job's W&B integration (project, name, entity, tags), if it has one."""
    for integration in spec.get("integrations") or []:
        if integration.get("type") == "wandb":
            return integration["wandb"]
    return None


class WandbRun:
    def __init__(self, run, say: Callable[[str], None], key: str | None):
        self.run, self.say, self.key = run, say, key

    @classmethod
    def start(
        cls, spec: dict, *, key: str | None, work: Path, say: Callable[[str], None]
    ) -> "WandbRun | None":
        """The job's W&B run, started; None when the job has none or W&B could not start."""
        wanted = wandb_settings(spec)
        if wanted is None:
            return None
        mode = spec.get("wandb_mode") or "online"
        folder = work / "wandb"
        try:
            folder.mkdir(parents=True, exist_ok=True)
            folder.chmod(0o700)  # the runner's: the training's user cannot read it
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
                dir=str(folder),
                mode=mode,
                reinit="create_new",
                settings=wandb.Settings(
                    api_key=key if mode == "online" else None,
                    silent=True,
                    console="off",  # the job's log is Veri's; W&B gets metrics only
                    save_code=False,
                    disable_git=True,
                    x_disable_stats=True,  # the runner's machine stats are not the training's
                    x_disable_meta=True,
                ),
            )
        except Exception as exc:  # noqa: BLE001 - an import error, the network, a refused key
            say(f"[veri] W&B: not logging this job: {_scrub(exc, key)}")
            return None
        say(f"[veri] W&B: logging metrics to {run.project} ({mode})")
        return cls(run, say, key)

    def log(self, step: int, values: dict) -> None:
        if self.run is None:
            return
        numbers = {
            k: v
            for k, v in values.items()
            if isinstance(v, int | float) and not isinstance(v, bool)
        }
        if not numbers:
            return
        try:
            self.run.log(numbers, step=step)
        except Exception as exc:  # noqa: BLE001 - W&B failing never fails the job
            self.say(f"[veri] W&B: stopped logging at step {step}: {_scrub(exc, self.key)}")
            self._finish(exit_code=1)

    def finish(self, *, ok: bool) -> None:
        self._finish(exit_code=0 if ok else 1)

    def _finish(self, *, exit_code: int) -> None:
        run, self.run = self.run, None
        if run is None:
            return
        try:
            run.finish(exit_code=exit_code)
        except Exception as exc:  # noqa: BLE001
            self.say(f"[veri] W&B: the run did not finish cleanly: {_scrub(exc, self.key)}")


def _scrub(exc: Exception, key: str | None) -> str:
    """The error, one line, without the key should an error message quote it."""
    text = f"{type(exc).__name__}: {exc}".replace("\n", " ")[:300]
    return text.replace(key, "***") if key else text
