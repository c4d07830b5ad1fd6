from billing.models import BillingAccount
from veri.models import Workspace


def open_billing_account(*, workspace: Workspace) -> BillingAccount:
    account, _ = BillingAccount.objects.get_or_create(workspace=workspace)
    return account
