"""`client.datasets` and `client.training_jobs`: submit, watch (logs stream while you wait),
cancel, resume, quote, and download the trained checkpoint, verified."""

from __future__ import annotations

import contextlib
import hashlib
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, fields
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, TextIO

from veri_sdk.errors import VeriAPIError
from veri_sdk.http import ApiTransport, StorageTransport

if TYPE_CHECKING:
    from veri_sdk.client import Client

TERMINAL = {"completed", "failed", "cancelled"}
SETTLE_WAIT_SECONDS = 60  # a finished job's charge is written by a task moments later
LOG_POLL_SECONDS = 1.0


class WaitTimeout(VeriAPIError):
    """`wait(timeout=…)` ran out before the job finished; `job` is its last known state."""

    def __init__(self, job: TrainingJob, timeout: float):
        super().__init__(0, "wait_timeout", f"{job.id} is still {job.status} after {timeout} s.")
        self.job = job


class DownloadFailed(VeriAPIError):
    """A downloaded file did not match the size or sha256 the API listed (run it again)."""


@dataclass
class Dataset:
    """A dataset. Uploading the same bytes again gives back this dataset (same id), so a script
    may upload its file on every run without making copies."""

    id: str
    source: str
    name: str = ""
    row_count: int | None = None
    data: dict = field(default_factory=dict, repr=False)
    datasets: Datasets | None = field(default=None, repr=False, compare=False)
    # From `upload`: False when the workspace already had these bytes and this is that dataset.
    created: bool = field(default=True, compare=False)

    @classmethod
    def from_api(cls, data: dict, datasets: Datasets | None = None) -> Dataset:
        name, rows = data.get("name") or "", data.get("row_count")
        return cls(data["id"], data["source"], name, rows, data=data, datasets=datasets)

    def _datasets(self) -> Datasets:
        from veri_sdk.client import Client

        return self.datasets or Client().datasets

    def preview(self, rows: int = 5) -> list:
        """The first `rows` rows (at most 50), each as its JSON value; an uploaded or volume
        dataset only (a hub dataset's rows are on the hub)."""
        return self._datasets().preview(self.id, rows=rows)

    def delete(self) -> None:
        """Delete it (and its stored file); refused while a job or OpenAI file uses it."""
        self._datasets().delete(self.id)

    @classmethod
    def from_volume(
        cls, volume: str, path: str, *, name: str = "", client: Client | None = None
    ) -> Dataset:
        """A file in a volume as a dataset: `Dataset.from_volume("my-corpus", "train.jsonl")`
        (with `Client()` from the environment unless one is given)."""
        from veri_sdk.client import Client

        return (client or Client()).datasets.from_volume(volume, path, name=name)


class Datasets:
    def __init__(self, api: ApiTransport):
        self.api = api

    def upload(self, path: str | Path, *, name: str = "") -> Dataset:
        path = Path(path)
        with path.open("rb") as f:
            data, status = self.api.request_with_status(
                "POST",
                "/datasets",
                files={"file": (path.name, f)},
                data={"name": name} if name else None,
            )
        dataset = Dataset.from_api(data, self)
        dataset.created = status == 201
        return dataset

    def from_volume(self, volume: str, path: str, *, name: str = "") -> Dataset:
        body = {"source": "volume", "volume": volume, "path": path, "name": name}
        return Dataset.from_api(self.api.request("POST", "/datasets", json=body), self)

    def connect_hf(self, repo: str, *, split: str = "train", revision: str = "main") -> Dataset:
        body = {"source": "hf", "repo": repo, "split": split, "revision": revision}
        return Dataset.from_api(self.api.request("POST", "/datasets", json=body), self)

    def get(self, dataset_id: str) -> Dataset:
        return Dataset.from_api(self.api.request("GET", f"/datasets/{dataset_id}"), self)

    def list(self) -> Iterator[Dataset]:
        """Every dataset of the workspace, newest first, page after page."""
        return (Dataset.from_api(d, self) for d in self.api.paginate("/datasets"))

    def preview(self, dataset_id: str, *, rows: int = 5) -> list:
        """The first `rows` rows (at most 50) of an uploaded or volume dataset."""
        body = self.api.request("GET", f"/datasets/{dataset_id}/preview", params={"rows": rows})
        return body["rows"]

    def delete(self, dataset_id: str) -> None:
        """Refused (ConflictError, naming them) while a job or OpenAI file uses the dataset."""
        self.api.request("DELETE", f"/datasets/{dataset_id}")


@dataclass
class TrainingJob:
    id: str
    status: str
    method: str
    base_model: str
    created_at: str
    started_at: str | None = None
    finished_at: str | None = None
    error: dict | None = None
    cost_usd: str | None = None
    refund: dict | None = None
    credited_usd: str | None = None  # credited back so far: lost compute, a refund
    net_cost_usd: str | None = None  # cost_usd less credited_usd
    ledger: list = field(default_factory=list)  # the charge and each credit, with its reason
    restarts: list = field(default_factory=list)  # each restarted run's kept and lost compute
    last_step: int | None = None
    metrics_summary: dict | None = None
    timings: dict | None = None  # when the run entered each start-up phase (docs/api.md)
    data: dict = field(default_factory=dict, repr=False)
    _jobs: TrainingJobs | None = field(default=None, repr=False, compare=False)

    @classmethod
    def from_api(cls, data: dict, jobs: TrainingJobs) -> TrainingJob:
        names = {f.name for f in fields(cls)} - {"data", "_jobs"}
        return cls(**{k: data.get(k) for k in names if k in data}, data=data, _jobs=jobs)

    @property
    def finished(self) -> bool:
        return self.status in TERMINAL

    def refresh(self) -> TrainingJob:
        """This object, brought up to date."""
        fresh = self._jobs.get(self.id)
        for f in fields(self):
            if f.name != "_jobs":
                setattr(self, f.name, getattr(fresh, f.name))
        return self

    def logs(self) -> list[str]:
        """Every log line so far."""
        return list(self._jobs.log_lines(self.id))

    def metrics(self) -> list[dict]:
        return self._jobs.metrics(self.id)

    def events(self) -> list[dict]:
        return self._jobs.events(self.id)

    def checkpoints(self) -> list[dict]:
        return self._jobs.checkpoints(self.id)

    def cancel(self) -> TrainingJob:
        return self._jobs.cancel(self.id)

    def resume(self, *, checkpoint_id: str | None = None) -> TrainingJob:
        return self._jobs.resume(self.id, checkpoint_id=checkpoint_id)

    def wait(
        self,
        poll_interval: float = 15,
        stream: bool = True,
        timeout: float | None = None,
        *,
        out: TextIO | None = None,
    ) -> TrainingJob:
        return self._jobs.wait(
            self.id, poll_interval=poll_interval, stream=stream, timeout=timeout, out=out
        )

    def download(
        self,
        output_dir: str | Path = "./checkpoints",
        *,
        on_file: Callable[[str, bool], None] | None = None,
    ) -> Path:
        return self._jobs.download(self.id, output_dir=output_dir, on_file=on_file)


class TrainingJobs:
    def __init__(self, api: ApiTransport, storage: StorageTransport):
        self.api, self.storage = api, storage

    def create(self, *, validation_dataset: Dataset | str | None = None, **fields) -> TrainingJob:
        """Submit a job: base_model, dataset_id, method, reward_source (grpo), output_name,
        hyperparameters, lora, gpu_type, gpu_count, provider, region, … (docs/api.md).
        `validation_dataset` (a Dataset or its id) is evaluated every `eval_interval` steps."""
        if validation_dataset is not None:
            fields["validation_dataset_id"] = getattr(validation_dataset, "id", validation_dataset)
        return TrainingJob.from_api(self.api.request("POST", "/training_jobs", json=fields), self)

    def quote(self, **fields) -> dict:
        """What `create(**fields)` would cost: `cost_usd` {low, expected, high}, `gpu_seconds`,
        `price_per_hour_usd` and the `assumptions` used. Rents nothing."""
        return self.api.request("POST", "/training_jobs/quote", json=fields)

    def get(self, job_id: str) -> TrainingJob:
        return TrainingJob.from_api(self.api.request("GET", f"/training_jobs/{job_id}"), self)

    def list(self) -> Iterator[TrainingJob]:
        """Every job of the workspace, newest first, page after page."""
        return (TrainingJob.from_api(j, self) for j in self.api.paginate("/training_jobs"))

    def cancel(self, job_id: str) -> TrainingJob:
        return TrainingJob.from_api(
            self.api.request("POST", f"/training_jobs/{job_id}/cancel"), self
        )

    def resume(self, job_id: str, *, checkpoint_id: str | None = None) -> TrainingJob:
        body = {"checkpoint_id": checkpoint_id} if checkpoint_id else {}
        return TrainingJob.from_api(
            self.api.request("POST", f"/training_jobs/{job_id}/resume", json=body), self
        )

    def logs(self, job_id: str, *, after: int = -1) -> dict:
        """One page of log lines after `after`: `{lines: [{seq, at, text}], next_seq, finished}`."""
        return self.api.request("GET", f"/training_jobs/{job_id}/logs", params={"after": after})

    def log_lines(self, job_id: str, *, after: int = -1) -> Iterator[str]:
        while True:
            page = self.logs(job_id, after=after)
            yield from (line["text"] for line in page["lines"])
            if not page["lines"]:
                return
            after = page["next_seq"]

    def full_log(self, job_id: str) -> str:
        return self.api.request("GET", f"/training_jobs/{job_id}/logs/full")

    def metrics(self, job_id: str) -> list[dict]:
        return list(self.api.paginate(f"/training_jobs/{job_id}/metrics"))

    def events(self, job_id: str) -> list[dict]:
        return list(self.api.paginate(f"/training_jobs/{job_id}/events"))

    def checkpoints(self, job_id: str) -> list[dict]:
        return list(self.api.paginate(f"/training_jobs/{job_id}/checkpoints"))

    def wait(
        self,
        job_id: str,
        *,
        poll_interval: float = 15,
        stream: bool = True,
        timeout: float | None = None,
        out: TextIO | None = None,
    ) -> TrainingJob:
        """Poll until the job finishes (and its charge is settled, so `cost_usd` and `refund`
        are final), printing its log lines as they arrive when `stream`. Streaming is best
        effort: if reading the log fails, polling goes on quietly. Raises `WaitTimeout` after
        `timeout` seconds."""
        out = out or sys.stdout
        started = time.monotonic()
        after, job, next_poll, settle_deadline = -1, None, 0.0, None
        while True:
            now = time.monotonic()
            log_finished = False
            if stream:
                try:
                    after, log_finished = self._print_new_lines(job_id, after, out)
                except VeriAPIError:
                    stream = False  # best effort: keep polling the job quietly
            if job is None or now >= next_poll or log_finished:
                job = self.get(job_id)
                next_poll = now + poll_interval
            if job.finished:
                if job.data.get("billing_deducted_at"):
                    if stream:
                        with contextlib.suppress(VeriAPIError):  # the last lines, best effort
                            self._print_new_lines(job_id, after, out)
                    return job
                settle_deadline = settle_deadline or now + SETTLE_WAIT_SECONDS
                if now > settle_deadline:
                    return job
                next_poll = now  # finished: look again at once for the settled charge
            if timeout is not None and now - started > timeout:
                raise WaitTimeout(job, timeout)
            time.sleep(LOG_POLL_SECONDS if stream or job.finished else poll_interval)

    def _print_new_lines(self, job_id: str, after: int, out: TextIO) -> tuple[int, bool]:
        while True:
            page = self.logs(job_id, after=after)
            for line in page["lines"]:
                out.write(line["text"] + "\n")
            out.flush()
            after = page["next_seq"]
            if len(page["lines"]) < 1000:
                return after, page["finished"]

    def download(
        self,
        job_id: str,
        *,
        output_dir: str | Path = "./checkpoints",
        on_file: Callable[[str, bool], None] | None = None,
    ) -> Path:
        """The final model (adapter, config, tokenizer) into `<output_dir>/<job_id>/`, a folder
        `from_pretrained` loads. Each file is checked against the size and sha256 the API lists;
        a re-run fetches only what is missing or different (an interrupted download resumes).
        `on_file(path, fetched)` hears of each file once it is in place, `fetched` False when
        it was already there."""
        final = next((c for c in self.checkpoints(job_id) if c["final"]), None)
        if final is None:
            raise VeriAPIError(
                404, "no_final_checkpoint", f"Job {job_id} has no final model (it did not finish)."
            )
        folder = Path(output_dir) / job_id
        for file in final["files"]:
            target = _inside(folder, file["path"])
            if _matches(target, file):
                if on_file:
                    on_file(file["path"], False)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            size, digest = self.storage.download(file["url"], target)
            if size != file["size"] or (file.get("sha256") and digest != file["sha256"]):
                target.unlink(missing_ok=True)
                raise DownloadFailed(
                    0,
                    "download_mismatch",
                    f"{file['path']} arrived as {size} bytes (sha256 {digest[:12]}…), not "
                    f"{file['size']} bytes (sha256 {(file.get('sha256') or '?')[:12]}…); "
                    "download again.",
                )
            if on_file:
                on_file(file["path"], True)
        return folder


def _inside(folder: Path, path: str) -> Path:
    """`folder/path`, refusing a listed path that would land outside the folder."""
    relative = PurePosixPath(path)
    if relative.is_absolute() or ".." in relative.parts or not relative.parts:
        raise DownloadFailed(0, "invalid_path", f"refusing to write {path!r} outside {folder}")
    return folder.joinpath(*relative.parts)


def _matches(target: Path, file: dict) -> bool:
    if not target.is_file() or target.stat().st_size != file["size"]:
        return False
    if not file.get("sha256"):
        return True
    digest = hashlib.sha256()
    with target.open("rb") as f:
        while chunk := f.read(1024 * 1024):
            digest.update(chunk)
    return digest.hexdigest() == file["sha256"]
