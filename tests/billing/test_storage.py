"""Storage charges: daily per volume from the hourly usage snapshots, and what deleting a volume
does to them (nothing: the ledger is append-only)."""

from datetime import UTC, date, datetime, timedelta

import pytest

from billing import services
from billing.models import LedgerEntry
from tests.conftest import fill_volume
from volumes.models import UsageSnapshot

pytestmark = pytest.mark.django_db
GIB = 1024**3
DAY = date(2026, 11, 30)


@pytest.fixture
def volume(billed, settings, local_store_url):
    settings.VERI_STORE = local_store_url
    return fill_volume(billed, "corpus", {"a.bin": b"x"})


def snapshots(volume, day: date, hours: range, total_bytes: int) -> None:
    """What the hourly snapshot task would have recorded for `volume` on `day`."""
    start = datetime.combine(day, datetime.min.time(), tzinfo=UTC)
    for hour in hours:
        UsageSnapshot.objects.create(
            volume=volume,
            volume_ref=volume.public_id,
            workspace=volume.workspace,
            hour=start + timedelta(hours=hour),
            file_count=1,
            total_bytes=total_bytes,
        )


def test_storage_is_charged_daily_per_volume_once(api_client, volume):
    snapshots(volume, DAY, range(24), 100 * GIB)
    assert services.charge_storage(day=DAY) == 1
    assert services.charge_storage(day=DAY) == 0
    [entry] = LedgerEntry.objects.filter(kind="storage_charge")
    # 100 GiB for 24 of a month's 730 hours at 0.07 USD per GiB-month
    assert entry.amount_micros == -(100 * 24 * 70_000 // 730)
    assert entry.volume_ref == volume.public_id
    ledger = api_client.get("/v1/billing/ledger").json()["data"]
    assert ledger[0]["kind"] == "storage_charge" and ledger[0]["volume_id"] == volume.public_id


def test_deleting_a_charged_volume_leaves_its_charges_as_they_were(api_client, volume):
    snapshots(volume, DAY, range(24), 100 * GIB)
    services.charge_storage(day=DAY)
    before = list(LedgerEntry.objects.order_by("pk").values())
    answer = api_client.delete(f"/v1/volumes/{volume.public_id}?force=true")
    assert answer.status_code == 204
    assert list(LedgerEntry.objects.order_by("pk").values()) == before
    ledger = api_client.get("/v1/billing/ledger").json()["data"]
    assert (ledger[0]["kind"], ledger[0]["volume_id"]) == ("storage_charge", volume.public_id)
