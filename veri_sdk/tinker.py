"""`client.tinker`: keys for the official `tinker` SDK (`tml-…`), which it sends to Veri's
`/api/v1/…` routes. A key is shown once, when created; listing gives its prefix and times."""

from dataclasses import dataclass
from urllib.parse import quote

from veri_sdk.http import ApiTransport


@dataclass
class TinkerKey:
    id: str
    name: str
    prefix: str
    created_at: str
    last_used_at: str | None
    revoked_at: str | None
    key: str | None = None  # only when just created


class Tinker:
    def __init__(self, api: ApiTransport):
        self.api = api

    def create_key(self, name: str = "") -> TinkerKey:
        return TinkerKey(**self.api.request("POST", "/tinker/keys", json={"name": name}))

    def list_keys(self) -> list[TinkerKey]:
        return [TinkerKey(**k) for k in self.api.request("GET", "/tinker/keys")["data"]]

    def revoke_key(self, key_id: str) -> TinkerKey:
        return TinkerKey(**self.api.request("DELETE", f"/tinker/keys/{quote(key_id, safe='')}"))
