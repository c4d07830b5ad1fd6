"""What a Tinker model's uptime costs: charged per second at the catalog's price in windows that
are never charged twice, nothing after its end, 402 without funds, the session's cap ending it
with its state saved, a lost worker's uptime since its last save credited; idle and abandoned
models swept by the periodic task."""

from datetime import timedelta

import pytest
from django.utils import timezone

from billing import services as billing
from billing.models import LedgerEntry
from tests.conftest import assert_error, fill_volume
from tests.tinker_api.test_api import (
    BASE,
    new_model,
    next_op,
    optim,
    retrieve,
    tinker_client,
    worker,
)
from tinker_api import tasks
from tinker_api.models import (
    SAMPLER_SEQ,
    ModelStatus,
    OpKind,
    OpStatus,
    TinkerCheckpoint,
    TinkerModel,
    TinkerOperation,
    TinkerSession,
)
from tinker_api.services import sessions

pytestmark = pytest.mark.django_db
HOUR = 100_000  # the local provider's default price per hour, in micro-dollars
SLACK = 1_000  # 36 s of it: the test's own run time, under load


@pytest.fixture(autouse=True)
def quick(settings):
    settings.VERI_TINKER_WAIT_SECONDS = 0
    settings.VERI_LOCAL_PRICE_PER_HOUR = "0.10"


@pytest.fixture
def tk(workspace, billed):
    fill_volume(workspace, "models", {"tiny/config.json": b"{}", "tiny/model.bin": b"x"})
    return tinker_client(workspace)


def launched(model: TinkerModel, ago: timedelta) -> TinkerModel:
    """The model as if its machine started `ago` and its worker loaded it."""
    TinkerModel.objects.filter(pk=model.pk).update(
        launched_at=timezone.now() - ago, status=ModelStatus.READY
    )
    model.refresh_from_db()
    return model


def entries(workspace, kind) -> list[int]:
    ledger = LedgerEntry.objects.filter(workspace=workspace, kind=kind).order_by("pk")
    return list(ledger.values_list("amount_micros", flat=True))


def test_uptime_is_charged_to_the_second_once_per_window_and_not_after_the_end(tk, api_client):
    model = launched(new_model(tk), timedelta(hours=1))
    assert model.price_per_hour_micros == HOUR
    until = model.launched_at + timedelta(seconds=90)
    assert sessions.charge_uptime(model=model, until=until) == HOUR * 90 // 3600
    stale = TinkerModel.objects.get(pk=model.pk)
    stale.charged_until = None  # a twin run that read the model before the first charged it
    assert sessions.charge_uptime(model=stale, until=until) == 0
    model.refresh_from_db()
    assert sessions.charge_uptime(model=model, until=until) == 0
    assert entries(model.workspace, "tinker_charge") == [-2500]
    spend = api_client.get("/v1/billing").json()["spend_usd"]
    assert spend["tinker"] == "0.0025"

    tasks.sweep_models()  # the rest of the hour, due since VERI_TINKER_CHARGE_SECONDS
    model.refresh_from_db()
    charged = -sum(entries(model.workspace, "tinker_charge"))
    assert HOUR <= charged < HOUR + SLACK and model.charged_micros == charged
    sessions.end_model(model=model, status=ModelStatus.ENDED, code="session_ended", message="")
    model.refresh_from_db()
    assert sessions.charge_uptime(model=model, until=timezone.now() + timedelta(hours=1)) == 0
    tasks.sweep_models()
    assert -sum(entries(model.workspace, "tinker_charge")) == model.charged_micros < HOUR + SLACK


def test_a_model_needs_a_positive_balance(tk, workspace):
    session = tk.post("/api/v1/create_session", {"tags": []}, format="json").json()
    body = {"session_id": session["session_id"], "model_seq_id": 0, "base_model": BASE}
    spent = -billing.balance_micros(workspace=workspace)
    billing.record_entry(workspace=workspace, kind="adjustment", amount_micros=spent, key="spend")
    response = tk.post("/api/v1/create_model", body | {"lora_config": {"rank": 2}}, format="json")
    assert_error(response, 402, "insufficient_balance")
    assert not TinkerModel.objects.exists()


def test_a_session_budget_is_the_clients_or_the_default(tk, settings):
    body = {"tags": [], "user_metadata": {"veri_max_cost_usd": "2.5"}}
    session = tk.post("/api/v1/create_session", body, format="json").json()["session_id"]
    assert TinkerSession.objects.get(public_id=session).max_cost_micros == 2_500_000
    settings.VERI_TINKER_SESSION_MAX_COST_USD = "7"
    session = tk.post("/api/v1/create_session", {"tags": []}, format="json").json()["session_id"]
    assert TinkerSession.objects.get(public_id=session).max_cost_micros == 7_000_000
    bad = {"tags": [], "user_metadata": {"veri_max_cost_usd": "lots"}}
    response = tk.post("/api/v1/create_session", bad, format="json")
    assert_error(response, 400, "invalid_request", "user_metadata")


def test_the_budget_cap_saves_the_model_then_ends_it_charged_up_to_the_cap(tk):
    model = launched(new_model(tk), timedelta(hours=1))
    TinkerSession.objects.filter(pk=model.session_id).update(max_cost_micros=30_000)
    waiting = optim(tk, model, 1).json()["request_id"]
    w = worker(model)
    next_op(w, -1)  # the creation, as the worker runs it

    tasks.sweep_models()
    model.refresh_from_db()
    assert (model.status, model.error_code) == (ModelStatus.SAVING, "budget_exhausted")
    assert entries(model.workspace, "tinker_charge") == [-30_000]
    [charge] = LedgerEntry.objects.filter(workspace=model.workspace, kind="tinker_charge")
    assert charge.description.endswith("s on cpu (capped at the session's budget)")
    # The client's request sent before runs; the one numbered after the save is refused.
    assert_error(optim(tk, model, 2), 400, "budget_exhausted")
    creation = model.operations.get(seq_id=0).request_id
    w.post(f"{w.base}/operations/{creation}", {"ok": True}, format="json")
    assert next_op(w, 0).json()["operation"]["request_id"] == waiting
    w.post(f"{w.base}/operations/{waiting}", {"ok": True, "result": {"metrics": {}}}, format="json")
    save = next_op(w, 1).json()["operation"]
    assert (save["kind"], save["seq_id"]) == ("save_weights", 2)
    files = [{"path": "adapter_model.safetensors", "size": 4}]
    uploads = w.post(
        f"{w.base}/operations/{save['request_id']}/uploads", {"files": files}, format="json"
    )
    assert uploads.status_code == 200, uploads.json()
    done = {"ok": True, "result": {"files": files}}
    w.post(f"{w.base}/operations/{save['request_id']}", done, format="json")

    model.refresh_from_db()
    path = f"tinker://{model.model_id}/weights/budget_exhausted-2"
    assert (model.status, model.error_code) == (ModelStatus.ENDED, "budget_exhausted")
    assert f"Its state is saved as {path}." in model.error_message
    assert TinkerCheckpoint.objects.get(name="budget_exhausted-2").files == files
    assert entries(model.workspace, "tinker_charge") == [-30_000]  # never past the cap
    later = retrieve(tk, optim(tk, model, 3).json()["request_id"]).json()
    assert later["error"].startswith("budget_exhausted: ") and later["category"] == "user"
    body = {"session_id": model.session.public_id, "model_seq_id": 1, "base_model": BASE}
    again = tk.post("/api/v1/create_model", body | {"lora_config": {"rank": 2}}, format="json")
    assert_error(again, 402, "budget_exhausted")


def test_a_spent_balance_saves_and_ends_the_workspaces_models(tk, workspace):
    model = launched(new_model(tk), timedelta(minutes=10))
    spent = -billing.balance_micros(workspace=workspace)
    billing.record_entry(workspace=workspace, kind="adjustment", amount_micros=spent, key="spend")
    tasks.sweep_models()
    model.refresh_from_db()
    assert (model.status, model.error_code) == (ModelStatus.SAVING, "balance_exhausted")
    assert "Ask an operator for credit" in model.error_message  # no card payments here


def test_a_lost_worker_ends_the_model_and_credits_its_uptime_since_the_last_save(tk):
    model = launched(new_model(tk), timedelta(hours=1))
    TinkerModel.objects.filter(pk=model.pk).update(external_id="gone")
    save = model.operations.create(seq_id=1, kind="save_weights", status="done")
    save.__class__.objects.filter(pk=save.pk).update(
        finished_at=timezone.now() - timedelta(minutes=30)
    )
    model.refresh_from_db()
    sessions.end_model(model=model, status=ModelStatus.FAILED, code="worker_lost", message="gone")
    model.refresh_from_db()
    [charge] = entries(model.workspace, "tinker_charge")
    [credit] = entries(model.workspace, "refund_credit")
    assert HOUR <= -charge < HOUR + SLACK
    assert HOUR // 2 <= credit < HOUR // 2 + SLACK
    sessions.credit_lost_uptime(model=model)  # again: credited once
    assert entries(model.workspace, "refund_credit") == [credit]


def test_an_idle_session_is_swept_its_ready_models_saving_first(tk):
    model = launched(new_model(tk), timedelta(minutes=5))
    starting = TinkerModel.objects.create(
        session=model.session,
        workspace=model.workspace,
        model_id=f"{model.session.public_id}:train:1",
        model_seq_id=1,
        base_model=BASE,
        lora={"rank": 2},
    )
    old = timezone.now() - timedelta(hours=1)
    TinkerSession.objects.filter(pk=model.session_id).update(last_heartbeat_at=old)
    tasks.sweep_models()
    model.refresh_from_db()
    starting.refresh_from_db()
    assert (model.status, model.error_code) == (ModelStatus.SAVING, "session_ended")
    assert (starting.status, starting.error_code) == (ModelStatus.ENDED, "session_ended")
    assert_error(optim(tk, model, 1), 400, "session_ended")  # numbered after the save


def test_a_save_that_never_comes_ends_the_model_unsaved(tk, settings):
    model = launched(new_model(tk), timedelta(minutes=5))
    sessions.save_and_end(model=model, code="session_ended", message="Idle.")
    settings.VERI_TINKER_SAVE_TIMEOUT_SECONDS = -1
    tasks.sweep_models()
    model.refresh_from_db()
    assert (model.status, model.error_code) == (ModelStatus.ENDED, "session_ended")
    assert "Its state could not be saved as" in model.error_message


def test_an_end_saves_only_a_state_not_saved_yet(tk):
    """The client's own save_state after its last step is what the end keeps; a step after it
    is saved; an untrained model and a sampling-only one have nothing to save."""
    saved = launched(new_model(tk), timedelta(minutes=5))
    saved.operations.update(status=OpStatus.DONE)  # its creation ran
    done = {"model": saved, "status": OpStatus.DONE}
    TinkerOperation.objects.create(seq_id=1, kind=OpKind.OPTIM_STEP, **done)
    save = TinkerOperation.objects.create(
        seq_id=2, kind=OpKind.SAVE_WEIGHTS, payload={"name": "mine"}, **done
    )
    TinkerCheckpoint.objects.create(
        model=saved, workspace=saved.workspace, operation=save, name="mine", files=[]
    )
    sessions.save_and_end(model=saved, code="session_ended", message="Closed.")
    saved.refresh_from_db()
    assert (saved.status, saved.error_code) == (ModelStatus.ENDED, "session_ended")
    assert saved.error_message == (
        f"Closed. Its state is saved as tinker://{saved.model_id}/weights/mine."
    )
    assert saved.operations.count() == 3  # no save of its own

    TinkerModel.objects.filter(pk=saved.pk).update(status=ModelStatus.READY, ended_at=None)
    TinkerOperation.objects.create(seq_id=3, kind=OpKind.OPTIM_STEP, **done)
    sessions.save_and_end(model=saved, code="session_ended", message="Closed.")
    saved.refresh_from_db()
    assert saved.status == ModelStatus.SAVING  # the step after the client's save is kept
    assert saved.operations.filter(kind=OpKind.SAVE_WEIGHTS, seq_id=4).exists()

    untrained = launched(new_model(tk), timedelta(minutes=1))
    untrained.operations.update(status=OpStatus.DONE)  # created, nothing more
    sessions.save_and_end(model=untrained, code="session_ended", message="Closed.")
    untrained.refresh_from_db()
    assert untrained.status == ModelStatus.ENDED
    assert untrained.error_message == "Closed. Nothing trained it, so nothing was saved."

    sampler = TinkerModel.objects.create(
        session=saved.session,
        workspace=saved.workspace,
        model_id=f"{saved.session.public_id}:train:{SAMPLER_SEQ}",
        model_seq_id=SAMPLER_SEQ,
        base_model=BASE,
        lora={"rank": 1},
        status=ModelStatus.READY,
    )
    sessions.save_and_end(model=sampler, code="session_ended", message="Closed.")
    sampler.refresh_from_db()
    assert (sampler.status, sampler.error_message) == (ModelStatus.ENDED, "Closed.")
    assert not TinkerCheckpoint.objects.filter(model=sampler).exists()
