"""The Tinker page: keys issued (shown once) and revoked, the sessions with each model's
operations, tokens, cost and checkpoints, a checkpoint's adapter downloaded; another
workspace's key, checkpoint and sessions are not reachable."""

import io
import re
import tarfile

import pytest
from rest_framework.test import APIClient

from billing.models import LedgerEntry
from dashboard.templatetags.dashboard import binary_size
from serving.models import Deployment
from tests.conftest import get_url
from tests.dashboard.conftest import member_of, signed_in
from tests.tinker_api.test_api import forward_backward, tk  # noqa: F401 - a fixture
from tests.tinker_api.test_api import new_model as api_new_model
from tests.tinker_api.test_listing import new_model, new_session, save_checkpoint
from tinker_api.models import OpKind, OpStatus, TinkerKey, TinkerOperation
from training.models import Checkpoint
from veri import services as veri_services

pytestmark = pytest.mark.django_db


def test_a_tinker_key_is_shown_once_and_works_until_revoked(browser, billed):
    response = browser.post("/tinker/", {"name": "laptop"}, follow=True)
    assert response.redirect_chain == [("/tinker/", 302)]
    assert "no-store" in response["Cache-Control"]
    raw = re.search(r"data-new-key>(tml-[0-9a-f]+_[0-9a-f]+)<", response.content.decode()).group(1)
    client = APIClient()
    client.credentials(HTTP_X_API_KEY=raw)
    assert client.post("/api/v1/create_session", {}, format="json").status_code == 200
    again = browser.get("/tinker/").content.decode()
    assert raw not in again and "laptop" in again
    key = TinkerKey.objects.get(name="laptop")
    browser.post(f"/tinker/keys/{key.public_id}/revoke/")
    assert client.post("/api/v1/create_session", {}, format="json").status_code == 401
    assert "revoked" in browser.get("/tinker/").content.decode()


def test_sessions_show_each_models_operations_tokens_cost_and_checkpoints(
    browser, billed, tiny_model, tmp_path, store_kind
):
    session = new_session(billed)
    model = new_model(session, str(tiny_model))
    for seq, tokens in [(1, 30), (2, 12)]:
        TinkerOperation.objects.create(
            model=model, seq_id=seq, kind=OpKind.FORWARD_BACKWARD, tokens=tokens
        )
    TinkerOperation.objects.create(
        model=model, seq_id=3, kind=OpKind.OPTIM_STEP, status=OpStatus.DONE
    )
    checkpoint, _ = save_checkpoint(model, tiny_model, tmp_path / "saved")  # the 4th operation
    idle = new_model(session, str(tiny_model), seq=1)
    LedgerEntry.objects.create(
        workspace=billed,
        kind=LedgerEntry.Kind.ADJUSTMENT,
        amount_micros=-1_250_000,
        idempotency_key=f"tinker_charge:{model.model_id}:1",
    )

    page = browser.get("/tinker/").content.decode()
    row = re.search(rf'<tr data-model="{re.escape(model.model_id)}">(.*?)</tr>', page, re.S)[1]
    assert re.search(r"data-operations>4<", row) and re.search(r"data-tokens>42<", row)
    assert "1.25" in re.search(r"data-cost>([^<]*)<", row)[1]
    assert checkpoint.name in row
    idle_row = re.search(rf'<tr data-model="{re.escape(idle.model_id)}">(.*?)</tr>', page, re.S)[1]
    assert re.search(r"data-operations>0<", idle_row) and re.search(r"data-cost>—<", idle_row)

    # The checkpoint's link: its adapter as an archive, through a URL signed at the click.
    link = f"/tinker/models/{model.model_id}/checkpoints/{checkpoint.public_id}/"
    assert link in page
    response = browser.get(link)
    assert response.status_code == 302
    with tarfile.open(fileobj=io.BytesIO(get_url(APIClient(), response["Location"]))) as tar:
        assert sorted(tar.getnames()) == [
            "after-3/adapter_config.json",
            "after-3/adapter_model.safetensors",
        ]


def test_saved_states_are_listed_with_their_path_downloaded_and_deployed(
    browser, billed, tiny_model, tmp_path
):
    model = new_model(new_session(billed), "Qwen/Qwen2.5-0.5B")  # a base replicas can load
    older, _ = save_checkpoint(model, tiny_model, tmp_path / "older", name="plum")
    newer, _ = save_checkpoint(model, tiny_model, tmp_path / "newer", name="plum")
    path = f"tinker://{model.model_id}/weights/plum"

    page = browser.get("/tinker/").content.decode()
    rows = re.findall(r'<tr data-saved="([^"]+)">(.*?)</tr>', page, re.S)
    assert [public_id for public_id, _ in rows] == [newer.public_id, older.public_id]
    row = rows[0][1]
    assert f"<code data-path>{path}</code>" in row and model.model_id in row
    assert binary_size(newer.size_bytes) in row and newer.size_bytes > 0
    link = f"/tinker/models/{model.model_id}/checkpoints/{newer.public_id}/"
    with tarfile.open(
        fileobj=io.BytesIO(get_url(APIClient(), browser.get(link)["Location"]))
    ) as tar:
        assert sorted(tar.getnames()) == [
            "plum/adapter_config.json",
            "plum/adapter_model.safetensors",
        ]

    # Deploy: its adapter, a Veri checkpoint now, served on the Tinker model's base under its
    # path; again, the deployment already serving it.
    deployed = browser.post(f"{link}deploy/")
    deployment = Deployment.objects.get()
    assert deployed["Location"] == f"/deployments/{deployment.public_id}/"
    adapter = Checkpoint.objects.get(tinker_save=newer)
    assert (adapter.job, adapter.adapter_base) == (None, model.base_model)
    assert deployment.base_model == model.base_model and deployment.status == "starting"
    assert deployment.adapters == [{"name": path, "checkpoint_id": adapter.public_id}]
    assert browser.post(f"{link}deploy/")["Location"] == deployed["Location"]
    assert adapter.public_id in browser.get("/tinker/").content.decode()

    # The older save, whose path the newer one took, deploys under its Veri checkpoint's id.
    browser.post(f"/tinker/models/{model.model_id}/checkpoints/{older.public_id}/deploy/")
    older_adapter = Checkpoint.objects.get(tinker_save=older)
    assert Deployment.objects.latest("pk").adapters == [
        {"name": older_adapter.public_id, "checkpoint_id": older_adapter.public_id}
    ]


def test_another_workspaces_tinker_key_checkpoint_and_sessions_are_not_reachable(
    browser, billed, tiny_model, tmp_path
):
    other, _ = veri_services.create_workspace(name="rival")
    model = new_model(new_session(other), str(tiny_model))
    checkpoint, _ = save_checkpoint(model, tiny_model, tmp_path / "saved")
    key = TinkerKey.objects.create(workspace=other, prefix="abcd1234", secret_hash="x")

    assert browser.post(f"/tinker/keys/{key.public_id}/revoke/").status_code == 404
    key.refresh_from_db()
    assert key.revoked_at is None
    link = f"/tinker/models/{model.model_id}/checkpoints/{checkpoint.public_id}/"
    assert browser.get(link).status_code == 404
    assert browser.post(f"{link}deploy/").status_code == 404
    assert not Deployment.objects.exists()
    page = browser.get("/tinker/").content.decode()
    assert model.model_id not in page and "No session yet" in page
    assert "Nothing saved yet" in page

    # The rival's own member sees it.
    rival = signed_in(member_of(other, "rival@rival.test"))
    assert model.model_id in rival.get("/tinker/").content.decode()


def test_the_tokens_a_forward_backward_sends_are_counted_once(browser, tk):  # noqa: F811
    model = api_new_model(tk)
    for _ in range(2):  # the client retries a request with the same seq_id: one operation
        assert forward_backward(tk, model, 1).status_code == 200
    page = browser.get("/tinker/").content.decode()
    row = re.search(rf'<tr data-model="{re.escape(model.model_id)}">(.*?)</tr>', page, re.S)[1]
    # The create operation and the forward_backward; its one datum has 2 input tokens.
    assert re.search(r"data-operations>2<", row) and re.search(r"data-tokens>2<", row)
