"""A Tinker save's LoRA adapter is a Veri checkpoint: a managed job named by its `tinker://` path
trains on from it on the Tinker model's base, its worker fetching the saved adapter's files, unless
it covers the LM head; it is no job's `resume_from` (its optimizer state is Tinker's); deleting the
save deletes it; another workspace's path names nothing."""

import json

import pytest

from billing.services import open_billing_account
from tests.conftest import assert_error, client_for, get_url
from tests.tinker_api.test_listing import new_model, new_session, save_checkpoint
from tests.training.conftest import dataset, job_body, submit  # noqa: F401 - fixtures
from tinker_api.services import checkpoints
from training.models import Checkpoint, TrainingJob
from training.services.worker import build_spec
from veri import services as veri_services
from volumes.stores import store_for

pytestmark = pytest.mark.django_db


@pytest.fixture
def saved(billed, dataset, tiny_model, tmp_path):  # noqa: F811 - the dataset's store
    """A save of a Tinker model of the owner's workspace, on the base jobs here train."""
    model = new_model(new_session(billed), "tiny/model")
    return save_checkpoint(model, tiny_model, tmp_path / "saved", name="plum")[0]


def test_a_job_named_by_a_tinker_path_trains_on_from_its_adapter(
    api_client,
    saved,
    submit,  # noqa: F811
    tmp_path,
):
    job = submit(base_model=checkpoints.tinker_path(saved))
    adapter = Checkpoint.objects.get(tinker_save=saved)
    assert (job.base_model, job.adapter_from, job.resume_from) == ("tiny/model", adapter, None)
    assert (adapter.job, adapter.adapter_base, adapter.step) == (None, "tiny/model", 0)

    # The worker fetches the save's adapter files (not the optimizer's state) from their URLs.
    spec = build_spec(job=job)["adapter_from"]
    assert spec["checkpoint_id"] == adapter.public_id
    fetched = {f["path"]: get_url(api_client, f["url"]) for f in spec["files"]}
    assert sorted(fetched) == ["adapter_config.json", "adapter_model.safetensors"]
    stored = (tmp_path / "saved" / "adapter_model.safetensors").read_bytes()
    assert fetched["adapter_model.safetensors"] == stored


def test_a_save_covering_the_lm_head_is_refused_at_submit(
    api_client,
    saved,
    dataset,  # noqa: F811
    cloud,
):
    """Tinker trains the unembedding by default; the managed trainers cannot train on from it."""
    prefix = checkpoints.as_veri_checkpoint(saved).prefix
    store, key = store_for(prefix), prefix.key("adapter_config.json")
    config = json.loads(store.get_bytes(key)) | {"target_modules": ["lm_head", "q_proj"]}
    store.put_bytes(key, json.dumps(config).encode())
    path = checkpoints.tinker_path(saved)
    refused = api_client.post(
        "/v1/training_jobs", job_body(dataset, base_model=path), format="json"
    )
    error = assert_error(refused, 400, "invalid_base_model", "base_model")
    assert "lm_head" in error["message"] and "train_unembed=False" in error["message"]
    assert not TrainingJob.objects.exists()


def test_a_tinker_save_is_no_resume_from_and_goes_with_its_save(
    api_client,
    saved,
    dataset,  # noqa: F811
    cloud,
):
    adapter = checkpoints.as_veri_checkpoint(saved)
    assert checkpoints.as_veri_checkpoint(saved) == adapter  # made once
    # Named by its Veri id or by its tinker:// path, the answer says what to do instead.
    for named in (adapter.public_id, checkpoints.tinker_path(saved)):
        refused = api_client.post(
            "/v1/training_jobs", job_body(dataset, resume_from=named), format="json"
        )
        error = assert_error(refused, 400, "invalid_checkpoint", "resume_from")
        assert "base_model set to its tinker:// path" in error["message"]

    checkpoints.delete(saved)
    assert not Checkpoint.objects.filter(pk=adapter.pk).exists()


def test_another_workspaces_tinker_path_names_nothing(saved, cloud):
    other, _ = veri_services.create_workspace(name="other")
    open_billing_account(workspace=other, credit_micros=10_000_000)
    client = client_for(other)
    path = checkpoints.tinker_path(saved)
    body = {"base_model": path, "dataset_id": "ds_none", "method": "sft_text"}
    assert_error(client.post("/v1/training_jobs", body, format="json"), 400, "invalid_base_model")
    refused = client.post("/v1/deployments", {"adapters": [path]}, format="json")
    assert_error(refused, 400, "model_not_found", "adapters.0")
    assert not Checkpoint.objects.exists()  # nothing was made of it for them
