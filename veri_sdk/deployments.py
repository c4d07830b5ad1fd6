"""`client.deployments`: serve a base model and fine-tuned adapters behind the OpenAI-compatible
inference API (`/v1/chat/completions`). Deployments are the API's own objects (dicts)."""

from __future__ import annotations

import time

from veri_sdk.errors import VeriAPIError
from veri_sdk.http import ApiTransport


class Deployments:
    def __init__(self, api: ApiTransport):
        self.api = api

    def create(
        self,
        model: str | None = None,
        *,
        adapters: list[str] | None = None,
        base_model: str | None = None,
        **shape,
    ) -> dict:
        """Deploy `model` (an `ft:` model, a Tinker save's `tinker://` path, a checkpoint id or a
        training job's id, served as an adapter on its base; a base model name otherwise) and any
        further `adapters`. `shape`: any of `gpu_type`, `gpu_count`, `provider`, `region`,
        `min_replicas`, `max_replicas`, `idle_timeout_seconds`."""
        names = list(adapters or [])
        if model and model.startswith(("ft:", "tinker://", "ckpt_", "job_")):
            names.insert(0, model)
        elif model:
            base_model = model
        body = {"adapters": names, **shape} | ({"base_model": base_model} if base_model else {})
        return self.api.request("POST", "/deployments", json=body)

    def list(self) -> list[dict]:
        return list(self.api.paginate("/deployments"))

    def get(self, deployment_id: str) -> dict:
        return self.api.request("GET", f"/deployments/{deployment_id}")

    def update(self, deployment_id: str, **changes) -> dict:
        """Any of `min_replicas`, `max_replicas`, `idle_timeout_seconds`, `adapters`."""
        return self.api.request("PATCH", f"/deployments/{deployment_id}", json=changes)

    def delete(self, deployment_id: str) -> None:
        """Stop its replicas (their machines terminated) and remove it."""
        self.api.request("DELETE", f"/deployments/{deployment_id}")

    def events(self, deployment_id: str) -> list[dict]:
        return list(self.api.paginate(f"/deployments/{deployment_id}/events"))

    def wait_ready(self, deployment_id: str, *, timeout: float = 900, poll: float = 2.0) -> dict:
        """The deployment once `ready` (or `failed`: its `error` says why); VeriAPIError
        `wait_timeout` when neither came within `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            deployment = self.get(deployment_id)
            if deployment["status"] in ("ready", "failed"):
                return deployment
            if time.monotonic() >= deadline:
                message = f"{deployment_id} is still {deployment['status']} after {timeout} s."
                raise VeriAPIError(0, "wait_timeout", message)
            time.sleep(poll)
