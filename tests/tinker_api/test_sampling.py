"""Sampling's control plane as the SDK calls it: a sampler is a model's weights saved at a point
of its order; its samples reach the worker once that save ran, between the ordered operations,
and their result is the protobuf the SDK reads. A named save's adapter is uploaded to the store:
once its model is over, its path starts a sampling-only model that loads it. Another workspace's
sampler is not found."""

import pytest
from rest_framework.test import APIClient
from tinker.proto.response_conv import deserialize_sample_response

from tests.conftest import assert_error, get_url, put_to_url
from tests.tinker_api.test_api import (  # noqa: F401 - quick and tk are fixtures
    new_model,
    next_op,
    optim,
    quick,
    retrieve,
    tinker_client,
    tk,
    worker,
)
from tinker_api.models import TinkerModel
from veri import services as veri_services

pytestmark = pytest.mark.django_db


def finish(w, operation: dict, result: dict | None = None):
    body = {"ok": True, "result": result or {}}
    return w.post(f"{w.base}/operations/{operation['request_id']}", body, format="json")


def asample(client: APIClient, sampler: str, **change):
    body = {
        "sampling_session_id": sampler,
        "seq_id": 0,
        "num_samples": 2,
        "prompt": {"chunks": [{"type": "encoded_text", "tokens": [5, 6]}]},
        "sampling_params": {"max_tokens": 3, "stop": [], "seed": 1},
    } | change
    return client.post("/api/v1/asample", body, format="json")


def test_a_sample_runs_with_its_samplers_weights_between_ordered_operations(tk):  # noqa: F811
    model = new_model(tk)
    w = worker(model)
    finish(w, next_op(w, -1).json()["operation"])
    body = {"model_id": model.model_id, "seq_id": 1, "sampling_session_seq_id": 0}
    save = tk.post("/api/v1/save_weights_for_sampler", body, format="json").json()
    sampler = f"{model.model_id}:sample:1"
    queued = asample(tk, sampler).json()
    assert queued["sample_sequence_ids"] == [f"{queued['request_id']}:{i}" for i in (0, 1)]
    optim(tk, model, 2)

    # The save runs first (the sample waits for it), then the sample, then the next step.
    operation = next_op(w, 0).json()["operation"]
    assert (operation["kind"], operation["request_id"]) == (
        "save_weights_for_sampler",
        save["request_id"],
    )
    finish(w, operation)
    assert retrieve(tk, save["request_id"]).json() == {
        "type": "save_weights_for_sampler",
        "sampling_session_id": sampler,
    }
    step = next_op(w, 1).json()["operation"]
    assert step["kind"] == "optim_step"  # the ordered operation comes first when both wait
    finish(w, step, {"metrics": {}})
    sample = next_op(w, 2).json()["operation"]
    assert (sample["kind"], sample["seq_id"]) == ("sample", 1)
    assert sample["payload"] == {
        "tokens": [5, 6],
        "num_samples": 2,
        "sampling_params": {
            "max_tokens": 3,
            "seed": 1,
            "stop": [],
            "temperature": 1.0,
            "top_k": -1,
            "top_p": 1.0,
        },
    }
    bad = {"sequences": [{"tokens": [1, 2], "logprobs": [-1.0], "stop_reason": "length"}]}
    response = finish(w, sample, bad)
    assert_error(response, 400, "invalid_request", "result")
    sequences = [
        {"tokens": [7, 8, 9], "logprobs": [-0.5, -1.5, -2.5], "stop_reason": "length"},
        {"tokens": [2], "logprobs": [-0.25], "stop_reason": "stop"},
    ]
    finish(w, sample, {"sequences": sequences})
    answer = retrieve(tk, queued["request_id"])
    assert answer["Content-Type"] == "application/x-protobuf"
    decoded = deserialize_sample_response(answer.content)
    assert [s.tokens for s in decoded.sequences] == [[7, 8, 9], [2]]
    assert decoded.sequences[0].logprobs == [-0.5, -1.5, -2.5]
    assert [s.stop_reason for s in decoded.sequences] == ["length", "stop"]

    info = tk.get(f"/api/v1/samplers/{sampler}").json()
    assert info == {"sampler_id": sampler, "base_model": model.base_model, "model_path": None}


def test_a_named_sampler_path_and_another_workspaces_sampler(tk):  # noqa: F811
    model = new_model(tk)
    w = worker(model)
    finish(w, next_op(w, -1).json()["operation"])
    body = {"model_id": model.model_id, "seq_id": 1, "path": "best"}
    save = tk.post("/api/v1/save_weights_for_sampler", body, format="json").json()
    path = f"tinker://{model.model_id}/sampler_weights/best"
    session = {"session_id": model.session.public_id, "model_path": path}
    assert_error(
        tk.post("/api/v1/create_sampling_session", session, format="json"), 404, "not_found"
    )
    kept = {"files": [{"path": "adapter_model.safetensors", "size": 7}]}
    finish(w, next_op(w, 0).json()["operation"], kept)  # saved: now it can be sampled
    assert retrieve(tk, save["request_id"]).json()["path"] == path
    created = tk.post("/api/v1/create_sampling_session", session, format="json").json()
    assert created["sampling_session_id"] == f"{model.model_id}:sample:1"

    other = tinker_client(veri_services.create_workspace(name="other")[0])
    assert_error(asample(other, created["sampling_session_id"]), 404, "not_found")
    assert_error(other.get(f"/api/v1/samplers/{created['sampling_session_id']}"), 404, "not_found")
    theirs = other.post("/api/v1/create_session", {"tags": []}, format="json").json()
    body = {"session_id": theirs["session_id"], "model_path": path}
    assert_error(
        other.post("/api/v1/create_sampling_session", body, format="json"), 404, "not_found"
    )


@pytest.mark.parametrize(
    ("change", "code"),
    [
        ({"topk_sample_logprobs": 5}, "unsupported"),
        ({"prompt_logprobs": True, "prompt_logprobs_last_n": 1}, "unsupported"),
        ({"num_samples": 0}, "invalid_request"),
        ({"prompt": {"chunks": [{"type": "image", "data": "x"}]}}, "invalid_request"),
        ({"sampling_params": {"max_tokens": 3, "stop": [1.5]}}, "invalid_request"),
    ],
)
def test_a_sample_veri_cannot_run_is_refused_at_once(tk, change, code):  # noqa: F811
    model = new_model(tk)
    assert_error(asample(tk, f"{model.model_id}:sample:1", **change), 400, code)


def test_a_named_samplers_adapter_is_kept_and_its_path_outlives_the_model(tk):  # noqa: F811
    model = new_model(tk)
    w = worker(model)
    finish(w, next_op(w, -1).json()["operation"])
    body = {"model_id": model.model_id, "seq_id": 1, "path": "eval"}
    tk.post("/api/v1/save_weights_for_sampler", body, format="json")
    path = f"tinker://{model.model_id}/sampler_weights/eval"

    # Its worker uploads the adapter (no optimizer state) to URLs the save's folder signs.
    save = next_op(w, 0).json()["operation"]
    adapter = {"adapter_config.json": b'{"r": 4}', "adapter_model.safetensors": b"weights"}
    files = [{"path": name, "size": len(data)} for name, data in adapter.items()]
    uploads = f"{w.base}/operations/{save['request_id']}/uploads"
    outside = w.post(uploads, {"files": [{"path": "../x", "size": 1}]}, format="json")
    assert outside.status_code == 400
    for target in w.post(uploads, {"files": files}, format="json").json()["files"]:
        put_to_url(w, target["url"], adapter[target["path"]])
    assert_error(finish(w, save, {}), 400, "invalid_request", "result")  # no files listed
    finish(w, save, {"files": files})

    # While the model is live, its path samples on its worker.
    session = {"session_id": model.session.public_id, "model_path": path}
    live = tk.post("/api/v1/create_sampling_session", session, format="json").json()
    assert live["sampling_session_id"] == f"{model.model_id}:sample:1"

    # Its session closed, the path starts a sampling-only model in the new session: the same
    # base and LoRA, its creation loading the kept adapter.
    tk.post(f"/api/v1/sessions/{model.session.public_id}/finish", {}, format="json")
    later = tk.post("/api/v1/create_session", {"tags": []}, format="json").json()["session_id"]
    body = {"session_id": later, "model_path": path, "sampling_session_seq_id": 2}
    created = tk.post("/api/v1/create_sampling_session", body, format="json").json()
    sampler = created["sampling_session_id"]
    assert sampler == f"{later}:train:10003:sample:1"
    again = tk.post("/api/v1/create_sampling_session", body, format="json").json()
    assert again["sampling_session_id"] == sampler  # a retried request: the same sampler
    loader = TinkerModel.objects.get(model_id=f"{later}:train:10003")
    assert (loader.base_model, loader.lora) == (model.base_model, model.lora)
    info = tk.get(f"/api/v1/samplers/{sampler}").json()
    assert info == {"sampler_id": sampler, "base_model": model.base_model, "model_path": path}
    w2 = worker(loader)
    creation = next_op(w2, -1).json()["operation"]
    load = creation["payload"]["load"]
    assert (creation["kind"], load["path"], load["optimizer"]) == ("create_model", path, False)
    assert {f["path"]: get_url(tk, f["url"]) for f in load["files"]} == adapter
    finish(w2, creation)
    assert next_op(w2, 0).json()["operation"]["kind"] == "save_weights_for_sampler"
    queued = asample(tk, sampler).json()
    assert queued["model_id"] == loader.model_id

    # Another workspace's path is not found, live model or not.
    other = tinker_client(veri_services.create_workspace(name="other")[0])
    theirs = other.post("/api/v1/create_session", {"tags": []}, format="json").json()
    body = {"session_id": theirs["session_id"], "model_path": path}
    assert_error(
        other.post("/api/v1/create_sampling_session", body, format="json"), 404, "not_found"
    )
