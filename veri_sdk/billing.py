"""`client.billing`: the workspace's balance, its ledger, and card top-ups."""

from dataclasses import dataclass

from veri_sdk.http import ApiTransport


@dataclass
class Balance:
    balance_usd: str
    low_balance: bool
    payments_enabled: bool
    spend_usd: dict[str, str]  # charged so far by kind: jobs, deployments, tinker, storage


class Billing:
    def __init__(self, api: ApiTransport):
        self.api = api

    def get(self) -> Balance:
        data = self.api.request("GET", "/billing")
        return Balance(
            data["balance_usd"], data["low_balance"], data["payments_enabled"], data["spend_usd"]
        )

    def ledger(self, *, limit: int | None = None) -> list[dict]:
        """Entries newest first: `kind, amount_usd, job_id, volume_id, description, created_at`;
        all of them, or the newest `limit`."""
        if limit is not None:
            return self.api.request("GET", "/billing/ledger", params={"limit": limit})["data"]
        return list(self.api.paginate("/billing/ledger"))

    def top_up(self, amount_usd) -> str:
        """A Stripe Checkout URL; the credit arrives once the payment goes through."""
        body = {"amount_usd": str(amount_usd)}
        return self.api.request("POST", "/billing/top_ups", json=body)["checkout_url"]
