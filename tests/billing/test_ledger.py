"""The ledger and the money a job moves: charges, refunds by the catalog, reviews, funds at submit,
quotes and budget caps."""

import contextlib
import threading
from datetime import timedelta

import pytest
from django.contrib.auth.models import Permission, User
from django.db import connection, transaction
from django.db.utils import DatabaseError, IntegrityError
from django.utils import timezone
from rest_framework.test import APIClient

from billing import services
from billing.models import AppendOnly, LedgerEntry, Refund
from providers.models import Instance
from tests.conftest import assert_error, fill_volume, in_threads, postgres_only, wait_for
from tests.training.conftest import GRPO_ROWS, drive, job_body, upload_dataset
from training import errors, tasks
from training.models import JobEvent, TrainingJob
from training.services import jobs
from veri.errors import Conflict
from veri.money import compute_micros

pytestmark = pytest.mark.django_db
L4_HOUR = 805_000  # the fake aws provider's L4, per hour, in micro-dollars

# What each way a job can fail does to money: the charge, and the refund's status (None: no
# refund). One row per catalog code, so a new code cannot land without its billing effect.
EXPECTED = {
    "oom": (True, None),
    "CAPACITY_UNAVAILABLE": (False, None),
    "QUOTA_EXCEEDED": (False, None),
    "PROVIDER_OUT_OF_FUNDS": (False, None),
    "launch_timeout": (False, None),
    "provisioning_error": (True, "credited"),
    "provisioning_timeout": (True, "credited"),
    "configuring_timeout": (True, "credited"),
    "heartbeat_timeout": (True, None),
    "worker_failed": (True, "pending"),
    "training_error": (True, None),
    "distributed_error": (True, "pending"),
    "training_stalled": (True, None),
    "hardware_error": (True, "credited"),
    "upload_failed": (True, "pending"),
    "provider_reclaimed": (True, "credited"),
    "max_run_duration_reached": (True, None),
    "config_error": (True, None),
    "dependency_error": (True, None),
    "volume_sync_incomplete": (True, "credited"),
    "volume_too_large_for_node": (True, None),
    "invalid_dataset": (True, None),
    "budget_exceeded": (True, None),
    "balance_exhausted": (True, None),
    "replica_start_timeout": (False, None),
    "replica_failed": (True, "credited"),
    "model_load_error": (True, None),
    "worker_lost": (True, "credited"),
    "session_ended": (True, None),
    "budget_exhausted": (True, None),
}


def failed_after_an_hour(submit, code: str, *, settle: bool = True) -> TrainingJob:
    """A job whose L4 ran one hour, then failed with `code`, settled by the real task unless
    `settle` is False (the settle task is queued, not run)."""
    job = submit()
    tasks.provision_job(job_id=job.pk)
    Instance.objects.filter(job=job).update(launched_at=timezone.now() - timedelta(hours=1))
    jobs.fail_job(job_id=job.pk, code=code)
    if settle:
        tasks.settle_job(job_id=job.pk)
    return TrainingJob.objects.select_related("workspace").get(pk=job.pk)


def kinds(job: TrainingJob) -> list[tuple[str, int]]:
    return list(
        LedgerEntry.objects.filter(job=job).order_by("pk").values_list("kind", "amount_micros")
    )


def test_the_table_covers_every_code_in_the_catalog():
    assert set(EXPECTED) == set(errors.CATALOG)


@pytest.mark.parametrize("code", sorted(EXPECTED))
def test_each_failure_moves_exactly_the_money_the_catalog_says(submit, api_client, code):
    charged, refund_status = EXPECTED[code]
    job = failed_after_an_hour(submit, code)
    entries = kinds(job)
    cost = job.billing.cost_micros
    if not charged:
        assert cost == 0 and entries == []
    else:
        assert L4_HOUR <= cost < L4_HOUR + 1000
        expected = [("job_charge", -cost)]
        if refund_status == "credited":
            expected.append(("refund_credit", cost))
        assert entries == expected
    assert (
        job.billing.billing_deducted_at is not None and job.billing.cost_attributed_at is not None
    )
    refund = api_client.get(f"/v1/training_jobs/{job.public_id}").json()["refund"]
    if refund_status is None:
        assert refund is None
    else:
        assert refund == {"status": refund_status, "amount_usd": services.usd(cost)}
    types = set(JobEvent.objects.filter(job=job).values_list("type", flat=True))
    assert ("job_refunded" in types) == (refund_status == "credited")


def test_compute_is_priced_in_integers():
    start = timezone.now()
    ran = timedelta(days=6, seconds=44_795, microseconds=102_000)
    # 563,195.102 s at 3.60 USD an hour is exactly 563.195102 USD (floats lost the last micro).
    assert compute_micros(price_per_hour_micros=3_600_000, start=start, end=start + ran) == (
        563_195_102
    )
    assert compute_micros(price_per_hour_micros=805_000, start=start, end=start - ran) == 0


def test_a_completed_job_is_charged_once_and_the_balance_is_the_sum(submit, billed):
    before = services.balance_micros(workspace=billed)
    job = submit()
    tasks.provision_job(job_id=job.pk)
    Instance.objects.filter(job=job).update(launched_at=timezone.now() - timedelta(hours=2))
    drive(job, "configuring", "running", "completed")
    for _ in range(3):
        tasks.settle_job(job_id=job.pk)
    job.refresh_from_db()
    assert kinds(job) == [("job_charge", -job.billing.cost_micros)]
    assert services.balance_micros(workspace=billed) == before - job.billing.cost_micros
    total = sum(
        LedgerEntry.objects.filter(workspace=billed).values_list("amount_micros", flat=True)
    )
    assert services.balance_micros(workspace=billed) == total


def test_cancel_before_running_is_free_and_while_running_charged_to_the_cancel(submit, api_client):
    early = submit()
    tasks.provision_job(job_id=early.pk)
    Instance.objects.filter(job=early).update(launched_at=timezone.now() - timedelta(hours=1))
    answer = api_client.post(f"/v1/training_jobs/{early.public_id}/cancel").json()
    assert (answer["cost_usd"], answer["refund"]) == ("0.00", None)
    assert answer["billing_deducted_at"] is not None and kinds(early) == []

    late = submit()
    tasks.provision_job(job_id=late.pk)
    Instance.objects.filter(job=late).update(launched_at=timezone.now() - timedelta(minutes=30))
    drive(late, "configuring", "running")
    answer = api_client.post(f"/v1/training_jobs/{late.public_id}/cancel").json()
    late.refresh_from_db()
    assert L4_HOUR // 2 <= late.billing.cost_micros < L4_HOUR // 2 + 1000
    assert kinds(late) == [("job_charge", -late.billing.cost_micros)]
    assert answer["cost_usd"] == services.usd(late.billing.cost_micros)


def test_the_ledger_is_append_only(submit, billed):
    entry = LedgerEntry.objects.filter(workspace=billed).first()
    entry.amount_micros = 1
    with pytest.raises(AppendOnly):
        entry.save()
    with pytest.raises(AppendOnly):
        entry.delete()
    with pytest.raises(AppendOnly):
        LedgerEntry.objects.filter(pk=entry.pk).update(amount_micros=1)
    with pytest.raises(AppendOnly):
        LedgerEntry.objects.filter(pk=entry.pk).delete()
    # Deletion cascades and related lookups go through the base manager: it refuses too.
    with pytest.raises(AppendOnly):
        LedgerEntry._base_manager.filter(pk=entry.pk).update(amount_micros=1)
    # A new instance given an existing row's key is an insert that fails, never an update.
    twin = LedgerEntry(pk=entry.pk, workspace=billed, kind="adjustment", amount_micros=1)
    with pytest.raises(IntegrityError), transaction.atomic():
        twin.save()
    assert LedgerEntry.objects.get(pk=entry.pk).amount_micros != 1


@postgres_only
def test_the_database_refuses_to_change_a_ledger_row(billed):
    entry = LedgerEntry.objects.filter(workspace=billed).first()
    for sql in (
        "UPDATE billing_ledgerentry SET amount_micros = 1 WHERE id = %s",
        "DELETE FROM billing_ledgerentry WHERE id = %s",
    ):
        with (
            pytest.raises(DatabaseError, match="append-only"),
            transaction.atomic(),
            connection.cursor() as cursor,
        ):
            cursor.execute(sql, [entry.pk])


def test_review_approve_deny_and_reattribute(submit, billed):
    operator = User.objects.create_user("op", is_staff=True)
    approved = failed_after_an_hour(submit, "worker_failed")
    denied = failed_after_an_hour(submit, "upload_failed")
    before = services.balance_micros(workspace=billed)
    services.approve_refund(refund_id=approved.refund.pk, reviewer=operator)
    services.approve_refund(refund_id=approved.refund.pk, reviewer=operator)  # twice: one credit
    with pytest.raises(Exception, match="reason"):
        services.deny_refund(refund_id=denied.refund.pk, reviewer=operator, reason=" ")
    services.deny_refund(refund_id=denied.refund.pk, reviewer=operator, reason="customer files")
    assert services.balance_micros(workspace=billed) == before + approved.billing.cost_micros
    assert Refund.objects.get(job=approved).status == "credited"
    assert Refund.objects.get(job=denied).status == "denied"
    # The operator finds it was the platform after all: re-attribution credits it, once.
    services.reattribute_job(
        job_id=denied.pk, attribution="platform", reason="store outage", changed_by=operator
    )
    services.reattribute_job(
        job_id=denied.pk, attribution="platform", reason="again", changed_by=operator
    )
    assert Refund.objects.get(job=denied).status == "credited"
    assert services.balance_micros(workspace=billed) == (
        before + approved.billing.cost_micros + denied.billing.cost_micros
    )
    # A customer-attributed failure re-attributed to the platform gets its money back too.
    oom = failed_after_an_hour(submit, "oom")
    services.reattribute_job(
        job_id=oom.pk, attribution="platform", reason="bad host", changed_by=operator
    )
    assert Refund.objects.get(job=oom).status == "credited"
    oom.refresh_from_db()
    assert oom.error_attribution == "platform"
    assert oom.attribution_changes.get().reason == "bad host"


@postgres_only
@pytest.mark.django_db(transaction=True)
def test_settling_and_approving_twice_at_once_moves_money_once(submit, billed):
    operator = User.objects.create_user("op", is_staff=True)
    credited = failed_after_an_hour(submit, "provisioning_error", settle=False)
    reviewed = failed_after_an_hour(submit, "worker_failed", settle=False)
    assert LedgerEntry.objects.filter(job__in=[credited, reviewed]).count() == 0
    in_threads(8, lambda i: tasks.settle_job(job_id=(credited, reviewed)[i % 2].pk))
    credited.refresh_from_db()
    reviewed.refresh_from_db()
    assert L4_HOUR <= credited.billing.cost_micros < L4_HOUR + 1000
    assert kinds(credited) == [
        ("job_charge", -credited.billing.cost_micros),
        ("refund_credit", credited.billing.cost_micros),
    ]
    assert kinds(reviewed) == [("job_charge", -reviewed.billing.cost_micros)]
    assert Refund.objects.get(job=reviewed).status == "pending"
    assert JobEvent.objects.filter(job=reviewed, type="refund_pending").count() == 1
    in_threads(
        6,
        lambda i: services.approve_refund(refund_id=reviewed.refund.pk, reviewer=operator),
    )
    for job in (credited, reviewed):
        assert kinds(job) == [
            ("job_charge", -job.billing.cost_micros),
            ("refund_credit", job.billing.cost_micros),
        ]
        assert JobEvent.objects.filter(job=job, type="job_refunded").count() == 1
    total = sum(
        LedgerEntry.objects.filter(workspace=billed).values_list("amount_micros", flat=True)
    )
    assert services.balance_micros(workspace=billed) == total


def waiting_for_a_lock() -> bool:
    """Whether some session waits for a lock (pg_locks is read live, unlike pg_stat_activity,
    whose snapshot lasts the reader's transaction)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_locks WHERE NOT granted")
        return cursor.fetchone()[0] > 0


def refund_outcome(job: TrainingJob) -> tuple[str, bool, bool]:
    """The refund's status, whether a credit was written, whether a denial was recorded."""
    types = set(JobEvent.objects.filter(job=job).values_list("type", flat=True))
    credited = LedgerEntry.objects.filter(job=job, kind="refund_credit").exists()
    return Refund.objects.get(job=job).status, credited, "refund_denied" in types


@postgres_only
@pytest.mark.django_db(transaction=True)
def test_an_approval_waiting_on_a_denial_leaves_the_refund_denied(submit, billed):
    operator = User.objects.create_user("op", is_staff=True)
    job = failed_after_an_hour(submit, "worker_failed")
    refund_id = job.refund.pk
    conflicts = []

    def approve():
        try:
            services.approve_refund(refund_id=refund_id, reviewer=operator)
        except Conflict as exc:
            conflicts.append(exc)
        finally:
            connection.close()

    approval = threading.Thread(target=approve)
    # The denial holds the refund's row while the approval starts and waits for it.
    with transaction.atomic():
        Refund.objects.select_for_update().get(pk=refund_id)
        approval.start()
        wait_for(waiting_for_a_lock, 10, "the approval to wait for the refund's row")
        services.deny_refund(refund_id=refund_id, reviewer=operator, reason="customer files")
    approval.join()
    assert refund_outcome(job) == ("denied", False, True)
    assert len(conflicts) == 1


@postgres_only
@pytest.mark.django_db(transaction=True)
def test_approve_and_deny_at_once_credit_or_deny_never_both(submit, billed):
    operator = User.objects.create_user("op", is_staff=True)
    reviewed = [failed_after_an_hour(submit, "worker_failed") for _ in range(3)]

    def decide(i: int):
        refund_id = reviewed[i // 2].refund.pk
        with contextlib.suppress(Conflict):  # the other decision came first
            if i % 2:
                services.deny_refund(refund_id=refund_id, reviewer=operator, reason="theirs")
            else:
                services.approve_refund(refund_id=refund_id, reviewer=operator)

    in_threads(2 * len(reviewed), decide)
    for job in reviewed:
        assert refund_outcome(job) in {("credited", True, False), ("denied", False, True)}
    total = sum(
        LedgerEntry.objects.filter(workspace=billed).values_list("amount_micros", flat=True)
    )
    assert services.balance_micros(workspace=billed) == total


@postgres_only
@pytest.mark.django_db(transaction=True)
def test_reattributing_at_once_has_one_effect(submit, billed):
    operator = User.objects.create_user("op", is_staff=True)
    denied = failed_after_an_hour(submit, "upload_failed")
    services.deny_refund(refund_id=denied.refund.pk, reviewer=operator, reason="customer files")
    oom = failed_after_an_hour(submit, "oom")  # no refund row yet
    in_threads(
        6,
        lambda i: services.reattribute_job(
            job_id=(denied, oom)[i % 2].pk,
            attribution="platform",
            reason="store outage",
            changed_by=operator,
        ),
    )
    for job in (denied, oom):
        assert kinds(job) == [
            ("job_charge", -job.billing.cost_micros),
            ("refund_credit", job.billing.cost_micros),
        ]
        assert JobEvent.objects.filter(job=job, type="job_refunded").count() == 1

    # Platform and customer at once: whichever comes second sees the first's refund, so the
    # job ends attributed to the platform and credited either way, never customer and credited.
    raced = failed_after_an_hour(submit, "worker_failed")

    def reattribute(i: int):
        with contextlib.suppress(Conflict):  # customer after a credit: an adjustment's job
            services.reattribute_job(
                job_id=raced.pk,
                attribution=("platform", "customer")[i % 2],
                reason="operators disagree",
                changed_by=operator,
            )

    in_threads(2, reattribute)
    raced.refresh_from_db()
    assert raced.error_attribution == "platform"
    assert Refund.objects.get(job=raced).status == "credited"
    assert kinds(raced) == [
        ("job_charge", -raced.billing.cost_micros),
        ("refund_credit", raced.billing.cost_micros),
    ]


def test_submit_needs_a_balance_that_covers_the_first_hour(api_client, dataset, cloud, workspace):
    spent = services.balance_micros(workspace=workspace)
    services.record_entry(
        workspace=workspace,
        kind=LedgerEntry.Kind.ADJUSTMENT,
        amount_micros=-spent + 500_000,  # 0.50 USD left; an L4 hour is 0.805
        key="test:drain",
    )
    error = assert_error(
        api_client.post("/v1/training_jobs", job_body(dataset), format="json"),
        402,
        "insufficient_balance",
    )
    assert "0.50" in error["message"] and "0.805" in error["message"]
    assert not TrainingJob.objects.exists()


def test_unfinished_jobs_hold_their_first_hour_against_the_balance(
    api_client, dataset, cloud, workspace
):
    """Ten jobs cannot start on the money for one: each unfinished job holds its first hour (or
    what it has cost so far, once more) when the next one is submitted."""
    spent = services.balance_micros(workspace=workspace)
    services.record_entry(
        workspace=workspace,
        kind=LedgerEntry.Kind.ADJUSTMENT,
        amount_micros=-spent + 1_200_000,  # 1.20 USD: one L4 hour (0.805), not two
        key="test:drain",
    )
    first = api_client.post("/v1/training_jobs", job_body(dataset), format="json")
    assert first.status_code == 201
    error = assert_error(
        api_client.post("/v1/training_jobs", job_body(dataset), format="json"),
        402,
        "insufficient_balance",
    )
    assert "1.20" in error["message"] and "hold 0.805" in error["message"]
    assert error["held_usd"] == "0.805"
    assert TrainingJob.objects.count() == 1
    api_client.post(f"/v1/training_jobs/{first.json()['id']}/cancel")  # before running: waived
    assert api_client.post("/v1/training_jobs", job_body(dataset), format="json").status_code == 201


@postgres_only
@pytest.mark.django_db(transaction=True)
def test_concurrent_submits_with_money_for_one_start_one_job(
    api_client, billed, cloud, settings, local_store_url
):
    """Twenty submits at once, with a balance that covers one job's first hour: the account row
    is locked in the submit's transaction, so each sees the jobs the others wrote."""
    settings.VERI_STORE = local_store_url
    dataset = upload_dataset(api_client, GRPO_ROWS)
    spent = services.balance_micros(workspace=billed)
    services.record_entry(
        workspace=billed,
        kind=LedgerEntry.Kind.ADJUSTMENT,
        amount_micros=-spent + 1_200_000,  # 1.20 USD: one L4 hour (0.805), not two
        key="test:drain",
    )

    def submit(_index):
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {api_client.raw_key}")
        response = client.post("/v1/training_jobs", job_body(dataset), format="json")
        return response.status_code, response.json()

    answers = in_threads(20, submit)
    statuses = sorted(status for status, _ in answers)
    assert statuses == [201] + [402] * 19, answers
    refused = [body["error"]["code"] for status, body in answers if status == 402]
    assert set(refused) == {"insufficient_balance"}
    assert TrainingJob.objects.filter(workspace=billed).count() == 1


def test_low_balance_counts_what_running_jobs_have_cost_so_far(api_client, dataset, cloud):
    job = TrainingJob.objects.get(
        public_id=api_client.post("/v1/training_jobs", job_body(dataset), format="json").json()[
            "id"
        ]
    )
    tasks.provision_job(job_id=job.pk)
    assert api_client.get("/v1/billing").json()["low_balance"] is False
    # 200 hours at 0.805 USD/h, not charged yet: more than the whole balance.
    Instance.objects.filter(job=job).update(launched_at=timezone.now() - timedelta(hours=200))
    billing = api_client.get("/v1/billing").json()
    assert billing["low_balance"] is True
    assert billing["balance_usd"] == services.usd(services.balance_micros(workspace=job.workspace))


@pytest.mark.parametrize(
    "config",
    [
        b'{"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 0}',
        b'{"hidden_size": 1' + b"0" * 400 + b', "num_hidden_layers": 2}',
        b'{"hidden_size": 1e308, "num_hidden_layers": 1e308}',
        b'{"hidden_size": 64, "num_hidden_layers": 2, "vocab_size": 1e400}',
        b'{"hidden_size": -64, "num_hidden_layers": 2}',
        b"[" * 100_000 + b"]" * 100_000,
    ],
    ids=["zero-heads", "huge", "inf", "overflow", "negative", "deep"],
)
def test_a_quote_survives_a_hostile_model_config(api_client, dataset, cloud, billed, config):
    fill_volume(billed, "models", {"odd/config.json": config})
    body = job_body(dataset, base_model="volume://models/odd")
    quote = api_client.post("/v1/training_jobs/quote", body, format="json")
    assert quote.status_code == 200, quote.content
    assert quote.json()["assumptions"]["parameters_source"] == "unknown: assumed 1B"


def test_a_quote_rents_nothing_and_states_its_assumptions(api_client, dataset, cloud, billed):
    fill_volume(
        billed,
        "models",
        {
            "qwen/config.json": b'{"hidden_size": 896, "num_hidden_layers": 24, '
            b'"intermediate_size": 4864, "num_attention_heads": 14, "num_key_value_heads": 2, '
            b'"vocab_size": 151936, "tie_word_embeddings": true}'
        },
    )
    body = job_body(dataset, base_model="volume://models/qwen", max_cost_usd="5")
    quote = api_client.post("/v1/training_jobs/quote", body, format="json").json()
    assert quote["price_per_hour_usd"] == "0.805"
    assumptions = quote["assumptions"]
    assert 480e6 < assumptions["parameters"] < 500e6  # Qwen2.5-0.5B: ~494M
    assert "config.json" in assumptions["parameters_source"]
    assert assumptions["steps"] == 5 and assumptions["dataset_rows"] == 8
    low, expected, high = (float(quote["cost_usd"][k]) for k in ("low", "expected", "high"))
    assert 0 < low < expected < high <= 5
    assert not TrainingJob.objects.exists() and not Instance.objects.exists()
    bad = api_client.post("/v1/training_jobs/quote", job_body(dataset, method="x"), format="json")
    assert_error(bad, 400, "invalid_method", "method")


def test_an_operator_adds_credit_once_however_often_the_form_is_sent(billed, client):
    operator = User.objects.create_user("op", password="pw", is_staff=True)
    operator.user_permissions.set(
        Permission.objects.filter(codename__in=["view_billingaccount", "add_credit"])
    )
    viewer = User.objects.create_user("viewer", password="pw", is_staff=True)
    viewer.user_permissions.set(Permission.objects.filter(codename="view_billingaccount"))
    account = billed.billing_account
    before = services.balance_micros(workspace=billed)
    form = {
        "action": "add_credit",
        "_selected_action": [str(account.pk)],
        "apply": "1",
        "amount_usd": "12.34",
        "reason": "goodwill after an outage",
        "token": "form-1",
    }
    client.force_login(viewer)
    client.post("/admin/billing/billingaccount/", form)
    assert services.balance_micros(workspace=billed) == before  # not allowed: nothing
    client.force_login(operator)
    asked = client.post(
        "/admin/billing/billingaccount/", {k: v for k, v in form.items() if k != "apply"}
    )
    assert b"Add credit" in asked.content  # the form, before anything moves
    for _ in range(2):  # a double submit of one form credits once
        client.post("/admin/billing/billingaccount/", form)
    assert services.balance_micros(workspace=billed) == before + 12_340_000
    entry = LedgerEntry.objects.filter(workspace=billed).latest("pk")
    assert (entry.kind, entry.created_by, entry.description) == (
        "adjustment",
        operator,
        "goodwill after an outage",
    )
