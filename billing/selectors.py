"""Reads of money, always within one workspace."""

from django.db.models import QuerySet

from billing.models import LedgerEntry
from veri.models import Workspace


def list_ledger(*, workspace: Workspace) -> QuerySet[LedgerEntry]:
    return LedgerEntry.objects.filter(workspace=workspace).select_related("job")
