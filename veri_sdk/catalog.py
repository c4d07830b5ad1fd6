"""`client.regions` and `client.gpus`: where jobs can run, on what, at what price."""

from veri_sdk.http import ApiTransport


class Regions:
    def __init__(self, api: ApiTransport):
        self.api = api

    def list(self) -> list[dict]:
        """`{code, name, default, coming_soon}` per region."""
        return self.api.request("GET", "/regions")["data"]


class Gpus:
    def __init__(self, api: ApiTransport):
        self.api = api

    def list(self, provider: str | None = None) -> list[dict]:
        """Per provider and GPU type: `usable`, memory, max count, price per GPU-hour, regions
        (with a provider, `available_regions` as it reports them right now)."""
        params = {"provider": provider} if provider else None
        return self.api.request("GET", "/gpus", params=params)["data"]
