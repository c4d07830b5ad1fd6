"""`client.evaluations`: compare a model with a baseline on a held-out file, one grader scoring
both models' answers (`/v1/evaluations`). Evaluations are the API's own objects (dicts)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from pathlib import Path

from veri_sdk.errors import VeriAPIError
from veri_sdk.http import ApiTransport

FINISHED = ("succeeded", "failed")


class Evaluations:
    def __init__(self, api: ApiTransport, datasets):
        self.api = api
        self.datasets = datasets

    def create(
        self,
        *,
        model: str,
        baseline: str,
        file: str | Path,
        grader: dict | None = None,
        reward_source: str | None = None,
        max_tokens: int | None = None,
        temperature: float | None = None,
    ) -> dict:
        """Queue an evaluation of `model` against `baseline` (each an `ft:` model, an adapter's
        name or a base model a deployment serves). `file`: a dataset id (`ds_…`), an OpenAI
        fine-tune file id (`file-…`), or a local JSONL path, uploaded first. Scored by `grader`
        (an OpenAI-style grader object: string_check, text_similarity, python, multi) or by the
        GRPO reward functions of `reward_source`. A file uploaded here for an evaluation the API
        refuses is deleted again (a file the workspace already had is kept)."""
        uploaded = None
        if isinstance(file, Path) or Path(file).is_file():
            uploaded = self.datasets.upload(file)
            file = uploaded.id
        body = {"model": model, "baseline": baseline, "file": file}
        if grader is not None:
            body["grader"] = grader
        if reward_source is not None:
            body["reward_source"] = reward_source
        if max_tokens is not None:
            body["max_tokens"] = max_tokens
        if temperature is not None:
            body["temperature"] = temperature
        try:
            return self.api.request("POST", "/evaluations", json=body)
        except VeriAPIError as exc:
            # Refused (a 4xx: nothing was created): the file uploaded for it alone goes too,
            # not one the workspace already had.
            if uploaded is not None and uploaded.created and 400 <= exc.status < 500:
                with contextlib.suppress(VeriAPIError):
                    self.datasets.delete(uploaded.id)
            raise

    def get(
        self, evaluation_id: str, *, limit: int | None = None, cursor: str | None = None
    ) -> dict:
        """The evaluation and a page of its samples (`samples: {data, next_cursor}`)."""
        params = {k: v for k, v in (("limit", limit), ("cursor", cursor)) if v is not None}
        return self.api.request("GET", f"/evaluations/{evaluation_id}", params=params or None)

    def samples(self, evaluation_id: str) -> list[dict]:
        """Every sample, in the file's order: prompt, both outputs, both scores."""
        found, cursor = [], None
        while True:
            page = self.get(evaluation_id, limit=200, cursor=cursor)["samples"]
            found += page["data"]
            cursor = page["next_cursor"]
            if not cursor:
                return found

    def list(self) -> list[dict]:
        return list(self.api.paginate("/evaluations"))

    def wait(
        self,
        evaluation_id: str,
        *,
        timeout: float = 3600,
        poll: float = 2.0,
        on_progress: Callable[[dict], None] | None = None,
    ) -> dict:
        """The evaluation once `succeeded` or `failed` (its `error` says why); VeriAPIError
        `wait_timeout` when neither came within `timeout` seconds. `on_progress` is called with
        the evaluation at each poll (its `samples_answered`, `samples_scored`) until then."""
        deadline = time.monotonic() + timeout
        while True:
            evaluation = self.get(evaluation_id, limit=1)
            if on_progress is not None and evaluation["status"] not in FINISHED:
                on_progress(evaluation)
            if evaluation["status"] in FINISHED:
                return evaluation
            if time.monotonic() >= deadline:
                message = f"{evaluation_id} is still {evaluation['status']} after {timeout} s."
                raise VeriAPIError(0, "wait_timeout", message)
            time.sleep(poll)
