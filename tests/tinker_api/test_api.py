"""The Tinker face's routes as the SDK calls them, and its worker's side: another workspace's
objects are not found, unsupported calls say so, operations reach the worker in the client's
order, a worker's token and results are checked, an idle session ends its models."""

from datetime import timedelta

import pytest
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.utils import timezone
from rest_framework.test import APIClient
from tinker import types
from tinker.proto.request_conv import forward_backward_request_to_proto

from tests.conftest import assert_error, fill_volume
from tinker_api.models import (
    ModelStatus,
    OpStatus,
    TinkerCheckpoint,
    TinkerModel,
    TinkerOperation,
)
from tinker_api.services import keys, sessions, workers
from veri import services as veri_services

pytestmark = pytest.mark.django_db

BASE = "volume://models/tiny"


@pytest.fixture(autouse=True)
def quick(settings):
    settings.VERI_TINKER_WAIT_SECONDS = 0  # answer polls at once


def tinker_client(workspace) -> APIClient:
    _, raw = keys.create_key(workspace=workspace)
    client = APIClient()
    client.credentials(HTTP_X_API_KEY=raw)
    return client


@pytest.fixture
def tk(workspace, billed) -> APIClient:
    fill_volume(workspace, "models", {"tiny/config.json": b"{}", "tiny/model.bin": b"x"})
    return tinker_client(workspace)


def new_model(tk, **lora) -> TinkerModel:
    session_id = tk.post("/api/v1/create_session", {"tags": []}, format="json").json()
    body = {
        "session_id": session_id["session_id"],
        "model_seq_id": 0,
        "base_model": BASE,
        "lora_config": {"rank": 4, **lora},
    }
    response = tk.post("/api/v1/create_model", body, format="json")
    assert response.status_code == 200, response.json()
    return TinkerModel.objects.get(model_id=response.json()["model_id"])


def optim(tk, model, seq_id):
    body = {"model_id": model.model_id, "seq_id": seq_id, "adam_params": {"learning_rate": 0.1}}
    return tk.post("/api/v1/optim_step", body, format="json")


def retrieve(tk, request_id):
    return tk.post("/api/v1/retrieve_future", {"request_id": request_id}, format="json")


def forward_backward(tk, model, seq_id):
    """As the SDK sends it: protobuf, encoded by the SDK's own code."""
    datum = types.Datum(
        model_input=types.ModelInput.from_ints([1, 2]), loss_fn_inputs={"target_tokens": [2, 3]}
    )
    request = types.ForwardBackwardRequest(
        forward_backward_input=types.ForwardBackwardInput(data=[datum], loss_fn="cross_entropy"),
        model_id=model.model_id,
        seq_id=seq_id,
    )
    body = forward_backward_request_to_proto(request).SerializeToString()
    return tk.post("/api/v1/forward_backward", body, content_type="application/x-protobuf")


def worker(model) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {sessions.mint_token(model=model)}")
    client.base = f"/v1/worker/tinker_models/{model.model_id}"
    return client


def next_op(w, after):
    return w.post(f"{w.base}/next", {"after": after, "wait": 0}, format="json")


def test_another_workspaces_session_model_and_future_are_not_found(tk):
    model = new_model(tk)
    future = optim(tk, model, 1).json()["request_id"]
    other = tinker_client(veri_services.create_workspace(name="other")[0])
    session = model.session.public_id
    for path, body in [
        ("get_info", {"model_id": model.model_id}),
        ("optim_step", {"model_id": model.model_id, "seq_id": 2, "adam_params": {}}),
        ("retrieve_future", {"request_id": future}),
        ("session_heartbeat", {"session_id": session}),
        (
            "create_model",
            {
                "session_id": session,
                "model_seq_id": 1,
                "base_model": BASE,
                "lora_config": {"rank": 4},
            },
        ),
    ]:
        assert_error(other.post(f"/api/v1/{path}", body, format="json"), 404, "not_found")
    assert TinkerOperation.objects.filter(model=model).count() == 2  # creation + the step
    assert_error(
        other.post(f"/api/v1/sessions/{session}/finish", {}, format="json"), 404, "not_found"
    )
    assert TinkerModel.objects.get(pk=model.pk).status == ModelStatus.STARTING


def test_the_client_closing_its_session_ends_it_and_its_models(tk):
    model = new_model(tk)
    waiting = optim(tk, model, 1).json()["request_id"]
    session = model.session.public_id
    finish = {"reason": {"type": "success"}, "detail": None}
    for _ in range(2):  # the client retries: a second close changes nothing
        response = tk.post(f"/api/v1/sessions/{session}/finish", finish, format="json")
        assert response.status_code == 200, response.json()
    model.refresh_from_db()
    assert (model.status, model.error_code) == (ModelStatus.ENDED, "session_ended")
    assert "closed the session (success)" in model.error_message
    assert retrieve(tk, waiting).json()["category"] == "user"
    heartbeat = {"session_id": session}
    assert tk.post("/api/v1/session_heartbeat", heartbeat, format="json").status_code == 410


def test_no_key_or_an_unknown_one_is_401():
    assert APIClient().post("/api/v1/create_session", {}, format="json").status_code == 401
    client = APIClient()
    client.credentials(HTTP_X_API_KEY="tml-abc_def")
    assert client.post("/api/v1/create_session", {}, format="json").status_code == 401


@pytest.mark.parametrize(
    "path",
    ["unload_model", "training_runs/x/checkpoints/weights/y/publish"],
)
def test_what_is_not_supported_yet_is_a_400_that_says_so(tk, path):
    error = assert_error(tk.post(f"/api/v1/{path}", {}, format="json"), 400, "unsupported")
    assert f"does not support /api/v1/{path}" in error["message"]


@pytest.mark.parametrize(
    ("change", "code", "field"),
    [
        ({"lora_config": None}, "unsupported", None),
        ({"optimizer_config": {"type": "dimuon"}}, "unsupported", "optimizer_config"),
        ({"base_model": "volume://models/elsewhere"}, "invalid_request", "base_model"),
        ({"lora_config": {"rank": 0}}, "invalid_request", "lora_config.rank"),
    ],
)
def test_a_model_veri_cannot_train_is_refused_at_once(tk, change, code, field):
    session = tk.post("/api/v1/create_session", {"tags": []}, format="json").json()["session_id"]
    body = {"session_id": session, "model_seq_id": 0, "base_model": BASE}
    body |= {"lora_config": {"rank": 4}} | change
    assert_error(tk.post("/api/v1/create_model", body, format="json"), 400, code, field)
    assert not TinkerModel.objects.exists()


def test_the_worker_runs_operations_in_the_clients_order(tk):
    model = new_model(tk)
    second = optim(tk, model, 2).json()["request_id"]  # sent first, numbered second
    first = optim(tk, model, 1).json()["request_id"]
    assert optim(tk, model, 1).json()["request_id"] == first  # a retried request
    assert retrieve(tk, first).json()["type"] == "try_again"
    w = worker(model)
    lora = w.post(f"{w.base}/register").json()["lora"]
    assert lora == {"rank": 4, "train_unembed": True, "train_mlp": True, "train_attn": True}
    creation = next_op(w, -1).json()["operation"]
    assert (creation["seq_id"], creation["kind"]) == (0, "create_model")
    assert next_op(w, 0).json()["operation"]["request_id"] == first
    assert w.post(f"{w.base}/operations/{creation['request_id']}", {"ok": True}, format="json")
    assert retrieve(tk, creation["request_id"]).json() == {
        "type": "create_model",
        "model_id": model.model_id,
    }
    done = {"ok": True, "result": {"metrics": {"grad_norm:mean": 0.5}}}
    w.post(f"{w.base}/operations/{first}", done, format="json")
    assert retrieve(tk, first).json() == {"metrics": {"grad_norm:mean": 0.5}}
    assert next_op(w, 1).json()["operation"]["request_id"] == second
    failed = {"ok": False, "error": "loss_fn_inputs['advantages'] is missing"}
    w.post(f"{w.base}/operations/{second}", failed, format="json")
    assert retrieve(tk, second).json() == {"error": failed["error"], "category": "user"}
    assert next_op(w, 2).json() == {"operation": None}
    model.refresh_from_db()
    assert model.status == ModelStatus.READY  # since its creation's answer


def test_a_worker_reaches_only_its_model_and_its_results_are_checked(tk):
    model = new_model(tk)
    body = {"session_id": model.session.public_id, "model_seq_id": 1, "base_model": BASE}
    created = tk.post("/api/v1/create_model", body | {"lora_config": {"rank": 2}}, format="json")
    other = TinkerModel.objects.get(model_id=created.json()["model_id"])
    w = worker(model)
    theirs = f"/v1/worker/tinker_models/{other.model_id}/next"
    assert w.post(theirs, {"after": -1}, format="json").status_code == 401
    creation = next_op(w, -1).json()["operation"]
    w.post(f"{w.base}/operations/{creation['request_id']}", {"ok": True}, format="json")
    step = forward_backward(tk, model, seq_id=1).json()
    assert next_op(w, 0).json()["operation"]["kind"] == "forward_backward"
    logprobs = {"dtype": "complex", "shape": [1], "data": [1]}
    bad = {"loss_fn_outputs": [{"logprobs": logprobs}], "metrics": {"loss:sum": 1.0}}
    answer = {"ok": True, "result": bad}
    response = w.post(f"{w.base}/operations/{step['request_id']}", answer, format="json")
    assert_error(response, 400, "invalid_request", "result")
    assert TinkerOperation.objects.get(request_id=step["request_id"]).status == OpStatus.RUNNING


def test_an_idle_session_ends_its_models_and_the_worker_is_told(tk):
    model = new_model(tk)
    waiting = optim(tk, model, 1).json()["request_id"]
    w = worker(model)
    old = timezone.now() - timedelta(hours=1)
    model.session.__class__.objects.filter(pk=model.session.pk).update(last_heartbeat_at=old)
    assert_error(next_op(w, -1), 410, "model_ended")
    model.refresh_from_db()
    assert (model.status, model.error_code) == (ModelStatus.ENDED, "session_ended")
    assert retrieve(tk, waiting).json()["category"] == "user"
    heartbeat = {"session_id": model.session.public_id}
    assert tk.post("/api/v1/session_heartbeat", heartbeat, format="json").status_code == 410
    assert next_op(w, -1).status_code == 401  # its token died with the model


def test_a_model_deleted_while_its_worker_polls_ends_the_poll(tk):
    model = new_model(tk)
    TinkerModel.objects.filter(pk=model.pk).delete()  # its workspace deleted, say
    with pytest.raises(workers.ModelEnded, match="no longer exists"):
        workers.next_operation(model=model, after=-1, wait=0)


def test_another_workspaces_checkpoint_is_not_found(tk):
    model = new_model(tk)
    operation = TinkerOperation.objects.create(model=model, seq_id=1, kind="save_weights")
    TinkerCheckpoint.objects.create(
        model=model,
        workspace=model.workspace,
        operation=operation,
        name="s1",
        files=[{"path": "adapter_model.safetensors", "size": 1}],
    )
    path = f"tinker://{model.model_id}/weights/s1"
    other = tinker_client(veri_services.create_workspace(name="other")[0])
    session = other.post("/api/v1/create_session", {"tags": []}, format="json").json()
    body = {"session_id": session["session_id"], "model_seq_id": 0, "path": path}
    response = other.post("/api/v1/load_weights", body | {"optimizer": True}, format="json")
    assert_error(response, 404, "not_found")
    mine = {"model_id": model.model_id, "seq_id": 2, "path": path, "optimizer": False}
    assert tk.post("/api/v1/load_weights", mine, format="json").status_code == 200


def test_models_run_on_a_cloud_provider_the_deployment_offers_and_rents_at_once(settings):
    """`aws` and `digitalocean` start a model's worker from their bootstrap; a provider not
    offered, a GPU type it does not list or rents only 8 to a machine, and GCP's Flex-start
    (billed while it waits for a GPU) are refused at startup."""
    settings.VERI_PROVIDER_ADAPTERS = {
        "local": "providers.local.LocalProvider",
        "aws": "providers.aws.AwsProvider",
        "digitalocean": "providers.digitalocean.DigitalOceanProvider",
        "gcp": "providers.gcp.GcpProvider",
    }
    for provider, gpu_type in (("aws", "L4-24GB"), ("digitalocean", "H100-80GB")):
        settings.VERI_TINKER_PROVIDER, settings.VERI_TINKER_GPU_TYPE = provider, gpu_type
        call_command("check")
    for provider, gpu_type, problem in (
        ("aws", "RTX4090-24GB", "no GPU type 'RTX4090-24GB'"),
        ("vast", "RTX4090-24GB", "not one of this deployment's VERI_PROVIDERS"),
        ("gcp", "H100-80GB", "only once it finds a GPU"),
        ("aws", "A100-80GB", "smallest machine with A100-80GB carries 8 GPUs"),
    ):
        settings.VERI_TINKER_PROVIDER, settings.VERI_TINKER_GPU_TYPE = provider, gpu_type
        with pytest.raises(SystemCheckError, match=f"tinker_api.E001.*{problem}"):
            call_command("check")
    settings.VERI_TINKER_PROVIDER, settings.VERI_TINKER_GPU_TYPE = "local", "cpu"
    call_command("check")


def test_the_capabilities_list_each_model_folder_once(tk, workspace):
    configs = ("tokenizer_config.json", "generation_config.json")
    fill_volume(workspace, "models", {f"tiny/{name}": b"{}" for name in configs})
    fill_volume(workspace, "models", {"notes/tokenizer_config.json": b"{}"})  # no model
    answer = tk.get("/api/v1/get_server_capabilities").json()
    assert [m["model_name"] for m in answer["supported_models"]] == [BASE]
