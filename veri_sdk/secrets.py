"""`client.secrets`: values the platform uses on the workspace's behalf (`WANDB_API_KEY` for a
job's W&B integration). A value is sent, never read back: listing gives names and times."""

from dataclasses import dataclass
from urllib.parse import quote

from veri_sdk.http import ApiTransport


@dataclass
class Secret:
    name: str
    created_at: str
    updated_at: str


class Secrets:
    def __init__(self, api: ApiTransport):
        self.api = api

    def set(self, name: str, value: str) -> Secret:
        """Create or replace the secret `name` (upper-case letters, digits, `_`)."""
        data = self.api.request("PUT", f"/secrets/{quote(name, safe='')}", json={"value": value})
        return Secret(**data)

    def list(self) -> list[Secret]:
        return [Secret(**s) for s in self.api.request("GET", "/secrets")["data"]]

    def delete(self, name: str) -> None:
        self.api.request("DELETE", f"/secrets/{quote(name, safe='')}")
