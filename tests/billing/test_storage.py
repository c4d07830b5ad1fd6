"""Storage charges: daily per volume from the hourly usage snapshots, and what deleting a volume
does to them (nothing: the ledger is append-only)."""

from datetime import UTC, date, datetime, timedelta

import pytest
from django.utils import timezone

from billing import services, tasks
from billing.models import LedgerEntry
from tests.conftest import fill_volume
from volumes import tasks as volume_tasks
from volumes.models import UsageSnapshot, Volume

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
    # The workspace's opening credit belongs to neither a job nor a volume: both null alike.
    assert (ledger[-1]["kind"], ledger[-1]["job_id"], ledger[-1]["volume_id"]) == (
        "adjustment",
        None,
        None,
    )


def test_deleting_a_charged_volume_leaves_its_charges_as_they_were(api_client, volume):
    snapshots(volume, DAY, range(24), 100 * GIB)
    services.charge_storage(day=DAY)
    before = list(LedgerEntry.objects.order_by("pk").values())
    answer = api_client.delete(f"/v1/volumes/{volume.public_id}?force=true")
    assert answer.status_code == 204
    assert list(LedgerEntry.objects.order_by("pk").values()) == before
    ledger = api_client.get("/v1/billing/ledger").json()["data"]
    assert (ledger[0]["kind"], ledger[0]["volume_id"]) == ("storage_charge", volume.public_id)


def storage_charges() -> dict[str, int]:
    """Each storage charge's day (from its key) and amount."""
    entries = LedgerEntry.objects.filter(kind="storage_charge").order_by("pk")
    return {e.idempotency_key.rsplit(":", 1)[1]: e.amount_micros for e in entries}


def test_a_missed_day_is_charged_by_the_next_run_once(volume):
    today = timezone.now().date()
    for back in (3, 2, 1):
        snapshots(volume, today - timedelta(days=back), range(24), 100 * GIB)
    services.charge_storage(day=today - timedelta(days=3))  # the run before the missed one
    assert tasks.charge_storage() == 2  # the missed day and yesterday
    assert tasks.charge_storage() == 0
    day_charge = -(100 * 24 * 70_000 // 730)
    assert storage_charges() == {
        (today - timedelta(days=back)).isoformat(): day_charge for back in (3, 2, 1)
    }


def test_a_deleted_volume_is_charged_up_to_its_deletion_and_no_further(api_client, volume):
    Volume.objects.filter(pk=volume.pk).update(total_bytes=100 * GIB)
    today = timezone.now().date()
    deleted_on = today - timedelta(days=2)
    midnight = datetime.combine(deleted_on, datetime.min.time(), tzinfo=UTC)
    for hour in range(24 + 24):  # the hourly snapshots, before and after the deletion
        if hour == 12:
            assert (
                api_client.delete(f"/v1/volumes/{volume.public_id}?force=true").status_code == 204
            )
        volume_tasks.take_usage_snapshots(now=midnight + timedelta(hours=hour, minutes=30))
    assert tasks.charge_storage() == 1
    # 12 hours of 100 GiB on the day of the deletion, nothing the day after
    assert storage_charges() == {deleted_on.isoformat(): -(100 * 12 * 70_000 // 730)}
