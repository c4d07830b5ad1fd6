from django.db import models

from veri.models import Workspace


class BillingAccount(models.Model):
    """A workspace may run jobs only with one (submit answers 402 otherwise). The ledger, balances
    and Stripe build on it."""

    workspace = models.OneToOneField(
        Workspace, on_delete=models.CASCADE, related_name="billing_account"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"billing account of {self.workspace}"
