"""`client.datasets` and `client.training_jobs`: submit, watch (logs stream while you wait),
cancel, resume, and download the trained checkpoint."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from veri_sdk.errors import VeriAPIError
from veri_sdk.http import ApiTransport, StorageTransport

TERMINAL = {"completed", "failed", "cancelled"}
SETTLE_WAIT_SECONDS = 60  # a finished job's charge is written by a task moments later


@dataclass
class Dataset:
    id: str
    source: str
    name: str = ""
    row_count: int | None = None


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
    last_step: int | None = None
    metrics_summary: dict | None = None
    data: dict = field(default_factory=dict, repr=False)
    _jobs: TrainingJobs | None = field(default=None, repr=False, compare=False)

    @classmethod
    def from_api(cls, data: dict, jobs: TrainingJobs) -> TrainingJob:
        names = cls.__dataclass_fields__.keys() - {"data", "_jobs"}
        return cls(**{k: data.get(k) for k in names if k in data}, data=data, _jobs=jobs)

    @property
    def finished(self) -> bool:
        return self.status in TERMINAL

    def wait(
        self, *, poll_interval: float = 2.0, stream: bool = True, out: TextIO | None = None
    ) -> TrainingJob:
        return self._jobs.wait(self.id, poll_interval=poll_interval, stream=stream, out=out)

    def download(self, output_dir: str | Path = "./checkpoints") -> Path:
        return self._jobs.download(self.id, output_dir=output_dir)


class Datasets:
    def __init__(self, api: ApiTransport):
        self.api = api

    def upload(self, path: str | Path, *, name: str = "") -> Dataset:
        path = Path(path)
        with path.open("rb") as f:
            data = self.api.request(
                "POST",
                "/datasets",
                files={"file": (path.name, f)},
                data={"name": name} if name else None,
            )
        return Dataset(data["id"], data["source"], data["name"], data["row_count"])

    def from_volume(self, volume: str, path: str, *, name: str = "") -> Dataset:
        body = {"source": "volume", "volume": volume, "path": path, "name": name}
        data = self.api.request("POST", "/datasets", json=body)
        return Dataset(data["id"], data["source"], data["name"])

    def connect_hf(self, repo: str, *, split: str = "train", revision: str = "main") -> Dataset:
        body = {"source": "hf", "repo": repo, "split": split, "revision": revision}
        data = self.api.request("POST", "/datasets", json=body)
        return Dataset(data["id"], data["source"], data["name"])


class TrainingJobs:
    def __init__(self, api: ApiTransport, storage: StorageTransport):
        self.api, self.storage = api, storage

    def create(self, **fields) -> TrainingJob:
        """Submit a job: base_model, dataset_id, method, reward_source (grpo), hyperparameters, …"""
        return TrainingJob.from_api(self.api.request("POST", "/training_jobs", json=fields), self)

    def quote(self, **fields) -> dict:
        """What `create(**fields)` would cost: `cost_usd` {low, expected, high}, `gpu_seconds`,
        `price_per_hour_usd` and the `assumptions` used. Rents nothing."""
        return self.api.request("POST", "/training_jobs/quote", json=fields)

    def get(self, job_id: str) -> TrainingJob:
        return TrainingJob.from_api(self.api.request("GET", f"/training_jobs/{job_id}"), self)

    def list(self) -> list[TrainingJob]:
        return [TrainingJob.from_api(j, self) for j in self.api.paginate("/training_jobs")]

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
        return self.api.request("GET", f"/training_jobs/{job_id}/logs", params={"after": after})

    def metrics(self, job_id: str) -> list[dict]:
        return list(self.api.paginate(f"/training_jobs/{job_id}/metrics"))

    def events(self, job_id: str) -> list[dict]:
        return list(self.api.paginate(f"/training_jobs/{job_id}/events"))

    def wait(
        self,
        job_id: str,
        *,
        poll_interval: float = 2.0,
        stream: bool = True,
        out: TextIO | None = None,
    ) -> TrainingJob:
        """Poll until the job finishes (and its charge is settled, so `cost_usd` and `refund`
        are final), printing its log lines as they arrive. Streaming is best effort: if reading
        the log fails, polling goes on quietly."""
        out = out or sys.stdout
        after, settle_deadline = -1, None
        while True:
            job = self.get(job_id)
            if stream:
                try:
                    while True:
                        page = self.logs(job_id, after=after)
                        for line in page["lines"]:
                            out.write(line["text"] + "\n")
                        out.flush()
                        after = page["next_seq"]
                        if len(page["lines"]) < 1000:
                            break
                except VeriAPIError:
                    stream = False
            if job.finished:
                if job.data.get("billing_deducted_at"):
                    return job
                settle_deadline = settle_deadline or time.monotonic() + SETTLE_WAIT_SECONDS
                if time.monotonic() > settle_deadline:
                    return job
                time.sleep(min(poll_interval, 1.0))
                continue
            time.sleep(poll_interval)

    def download(self, job_id: str, *, output_dir: str | Path = "./checkpoints") -> Path:
        """The final model (adapter, config, tokenizer) into `<output_dir>/<job_id>/`, a folder
        `from_pretrained` loads."""
        checkpoints = list(self.api.paginate(f"/training_jobs/{job_id}/checkpoints"))
        final = next((c for c in checkpoints if c["final"]), None)
        if final is None:
            raise VeriAPIError(
                404,
                "no_final_checkpoint",
                f"Job {job_id} has no final model (it did not complete).",
            )
        folder = Path(output_dir) / job_id
        for file in final["files"]:
            target = folder / file["path"]
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(self.storage.get(file["url"]))
        return folder
