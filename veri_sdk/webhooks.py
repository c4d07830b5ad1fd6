"""`client.webhooks`: endpoints that receive signed events (Standard Webhooks), and their
delivery log. Endpoints and deliveries are the API's own objects (dicts)."""

from __future__ import annotations

from veri_sdk.http import ApiTransport


class Webhooks:
    def __init__(self, api: ApiTransport):
        self.api = api

    def create(
        self, url: str, *, event_types: list[str] | None = None, description: str = ""
    ) -> dict:
        """A new endpoint; its `signing_secret` (`whsec_…`) is answered here only: keep it.
        No `event_types`: every event."""
        body = {"url": url, "event_types": event_types or [], "description": description}
        return self.api.request("POST", "/webhook_endpoints", json=body)

    def list(self) -> list[dict]:
        return list(self.api.paginate("/webhook_endpoints"))

    def get(self, endpoint_id: str) -> dict:
        return self.api.request("GET", f"/webhook_endpoints/{endpoint_id}")

    def update(self, endpoint_id: str, **changes) -> dict:
        """Any of `url`, `event_types`, `description`, `enabled`."""
        return self.api.request("PATCH", f"/webhook_endpoints/{endpoint_id}", json=changes)

    def delete(self, endpoint_id: str) -> None:
        self.api.request("DELETE", f"/webhook_endpoints/{endpoint_id}")

    def rotate_secret(self, endpoint_id: str, *, keep_old_for_24_hours: bool = False) -> dict:
        """The endpoint with its new `signing_secret`; kept, the old one also signs for a day."""
        body = {"keep_old_secret_active_for_24_hours": keep_old_for_24_hours}
        path = f"/webhook_endpoints/{endpoint_id}/rotate_secret"
        return self.api.request("POST", path, json=body)

    def test(self, endpoint_id: str) -> dict:
        """Queues a `webhook.test` event to this endpoint; answers its delivery."""
        return self.api.request("POST", f"/webhook_endpoints/{endpoint_id}/test")

    def deliveries(self, endpoint_id: str, *, limit: int | None = None) -> list[dict]:
        """Newest first, each with its `attempts`; all of them, or the newest `limit`."""
        path = f"/webhook_endpoints/{endpoint_id}/deliveries"
        if limit is not None:
            return self.api.request("GET", path, params={"limit": limit})["data"]
        return list(self.api.paginate(path))
