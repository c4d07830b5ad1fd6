"""The money stamps moved from training's job row onto billing's `JobBilling` (billing 0008,
training 0015): both ways, the values are carried over unchanged."""

from datetime import timedelta

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.utils import timezone

from billing.models import JobBilling

pytestmark = pytest.mark.django_db(transaction=True)

BEFORE = [("billing", "0007_stripe_events_and_modes"), ("training", "0014_worker_phase")]


def migrate(targets) -> None:
    executor = MigrationExecutor(connection)
    executor.migrate(targets)


def migrate_to_latest() -> None:
    """Every app at its newest migration again: later tests on this database need the schema
    as it is now, not as it was at billing 0008 and training 0015."""
    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes())


def stamps_on_jobs() -> dict[int, tuple]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT id, cost_micros, cost_attributed_at, billing_deducted_at"
            " FROM training_trainingjob"
        )
        return {row[0]: row[1:] for row in cursor.fetchall()}


def test_the_stamps_move_to_billing_and_back(submit):
    charged, attributed, fresh = submit(), submit(), submit()
    at = timezone.now() - timedelta(hours=1)
    JobBilling.objects.create(
        job=charged, cost_micros=805_123, cost_attributed_at=at, billing_deducted_at=at
    )
    JobBilling.objects.create(job=attributed, cost_micros=0, cost_attributed_at=at)
    try:
        migrate(BEFORE)  # back: the columns return, filled from billing's records
        jobs = stamps_on_jobs()
        assert jobs[charged.pk][0] == 805_123 and jobs[charged.pk][2] is not None
        assert jobs[attributed.pk][0] == 0 and jobs[attributed.pk][2] is None
        assert jobs[fresh.pk] == (None, None, None)
    finally:
        migrate_to_latest()  # forward again (through 0008 and 0015): one record per stamped job
    records = {r.job_id: r for r in JobBilling.objects.all()}
    assert set(records) == {charged.pk, attributed.pk}
    assert records[charged.pk].cost_micros == 805_123
    assert records[charged.pk].cost_attributed_at == at == records[charged.pk].billing_deducted_at
    assert (records[attributed.pk].cost_micros, records[attributed.pk].billing_deducted_at) == (
        0,
        None,
    )
