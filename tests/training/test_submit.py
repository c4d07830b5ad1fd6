"""Datasets and job submission: every bad input is a 400 naming its field, never a 500."""

import io

import pytest

from tests.conftest import assert_error, client_for, fill_volume
from tests.training.conftest import GRPO_ROWS, REWARD, job_body, upload_dataset
from training.models import Checkpoint, Dataset, JobEvent, TrainingJob
from veri import services as veri_services
from volumes import services as volume_services
from volumes.models import VolumeFile

pytestmark = pytest.mark.django_db


def test_uploaded_dataset_is_checked_once_per_method(api_client, settings, local_store_url):
    settings.VERI_STORE = local_store_url
    rows = [{"text": "hello"}, {"prompt": "p", "chosen": "a", "rejected": "b"}]
    dataset = upload_dataset(api_client, rows)
    assert (dataset["source"], dataset["row_count"]) == ("upload", 2)
    stored = Dataset.objects.get(public_id=dataset["id"])
    assert stored.first_bad_line == {
        "sft_text": {
            "line": 2,
            "problem": 'needs "text" (a string) or "messages" (a list of {role, content})',
        },
        "dpo": {"line": 1, "problem": 'needs "prompt" (a string or a list of {role, content})'},
        "grpo": {
            "line": 1,
            "problem": 'needs "prompt" (a string or a list of {role, content}) or "messages" '
            "(ending with a user message)",
        },
    }
    assert api_client.get(f"/v1/datasets/{dataset['id']}").json()["row_count"] == 2


def test_bad_dataset_files_are_refused(api_client, settings, local_store_url):
    settings.VERI_STORE = local_store_url
    settings.VERI_DATASET_MAX_BYTES = 100

    def post(content: bytes, name: str):
        upload = io.BytesIO(content)
        upload.name = name
        return api_client.post("/v1/datasets", {"file": upload}, format="multipart")

    assert_error(post(b'{"text": "x"}\n' * 20, "big.jsonl"), 413, "dataset_too_large", field="file")
    settings.VERI_DATASET_MAX_BYTES = 10_000
    assert_error(post(b'{"text": "x"}\n', "data.csv"), 400, "invalid_dataset", field="file")
    error = assert_error(post(b'{"text": "x"}\n{oops\n', "d.jsonl"), 400, "invalid_dataset")
    assert "line 2" in error["message"]
    assert_error(post(b"\n\n", "empty.jsonl"), 400, "invalid_dataset")
    assert not Dataset.objects.exists()


def test_hf_and_volume_datasets(api_client, workspace, settings, local_store_url):
    settings.VERI_STORE = local_store_url
    hf = api_client.post(
        "/v1/datasets", {"source": "hf", "repo": "openai/gsm8k", "split": "test"}, format="json"
    )
    assert hf.status_code == 201
    assert (hf.json()["repo"], hf.json()["split"], hf.json()["revision"]) == (
        "openai/gsm8k",
        "test",
        "main",
    )
    volume, _ = volume_services.create_volume(workspace=workspace, name="corpus")
    missing = api_client.post(
        "/v1/datasets",
        {"source": "volume", "volume": "corpus", "path": "train.jsonl"},
        format="json",
    )
    assert_error(missing, 400, "invalid_dataset", field="path")
    VolumeFile.objects.create(
        volume=volume, path="train.jsonl", size=3, object_key="k", uploaded_at=volume.created_at
    )
    ok = api_client.post(
        "/v1/datasets",
        {"source": "volume", "volume": "corpus", "path": "train.jsonl"},
        format="json",
    )
    assert ok.status_code == 201 and ok.json()["volume"] == "corpus"
    assert_error(
        api_client.post("/v1/datasets", {"source": "s3"}, format="json"),
        400,
        "invalid_request",
        field="source",
    )


def test_datasets_of_other_workspaces_are_404(
    api_client, other_api_client, settings, local_store_url
):
    settings.VERI_STORE = local_store_url
    dataset = upload_dataset(api_client, GRPO_ROWS)
    assert_error(other_api_client.get(f"/v1/datasets/{dataset['id']}"), 404, "not_found")
    assert other_api_client.get("/v1/datasets").json()["data"] == []


def test_submit_writes_a_queued_job_with_its_event(api_client, dataset, cloud):
    response = api_client.post("/v1/training_jobs", job_body(dataset), format="json")
    assert response.status_code == 201, response.json()
    body = response.json()
    assert body["id"].startswith("job_") and body["status"] == "queued"
    assert body["hyperparameters"]["max_steps"] == 5
    assert body["hyperparameters"]["rollouts_per_prompt"] == 8  # the method's default, shown
    assert (body["provider"], body["region"], body["error"], body["started_at"]) == (
        "aws",
        "us-east-1",
        None,
        None,
    )
    assert body["refund"] is None and body["last_step"] is None
    job = TrainingJob.objects.get(public_id=body["id"])
    assert list(JobEvent.objects.filter(job=job).values_list("type", flat=True)) == ["queued"]


def test_no_billing_account_is_402(api_client, workspace, settings, local_store_url, cloud):
    settings.VERI_STORE = local_store_url
    dataset = upload_dataset(api_client, GRPO_ROWS)
    response = api_client.post("/v1/training_jobs", job_body(dataset), format="json")
    assert_error(response, 402, "billing_account_required")
    assert not TrainingJob.objects.exists()


def test_grpo_agentic_is_unavailable_with_the_seeds_sentence(api_client, dataset, cloud):
    error = assert_error(
        api_client.post(
            "/v1/training_jobs", job_body(dataset, method="grpo_agentic"), format="json"
        ),
        400,
        "method_unavailable",
        field="method",
    )
    assert error["message"].startswith(
        "grpo_agentic is being rebuilt and is not currently runnable as a managed method."
    )


BAD_SUBMISSIONS = [
    ({"method": "ppo"}, "invalid_method", "method"),
    ({"reward_source": ""}, "invalid_reward", "reward_source"),
    ({"reward_source": "def reward(:\n"}, "invalid_reward", "reward_source"),
    ({"reward_source": "def score(c):\n    return 1\n"}, "invalid_reward", "reward_source"),
    (
        {"hyperparameters": {"learning_rate": 1e-5, "lr": 1}},
        "unknown_hyperparameter",
        "hyperparameters.lr",
    ),
    (
        {"hyperparameters": {"learning_rate": 0}},
        "invalid_hyperparameter",
        "hyperparameters.learning_rate",
    ),
    (
        {"hyperparameters": {"learning_rate": "fast"}},
        "invalid_hyperparameter",
        "hyperparameters.learning_rate",
    ),
    (
        {"hyperparameters": {"max_steps": 2.5}},
        "invalid_hyperparameter",
        "hyperparameters.max_steps",
    ),
    (
        {"hyperparameters": {"rollouts_per_prompt": 1}},
        "invalid_hyperparameter",
        "hyperparameters.rollouts_per_prompt",
    ),
    (
        {"hyperparameters": {"max_response_length": 0}},
        "invalid_hyperparameter",
        "hyperparameters.max_response_length",
    ),
    ({"hyperparameters": {"kl_coef": -1}}, "invalid_hyperparameter", "hyperparameters.kl_coef"),
    ({"hyperparameters": {"epochs": 0}}, "invalid_hyperparameter", "hyperparameters.epochs"),
    (
        {"hyperparameters": {"warmup_ratio": 1.5}},
        "invalid_hyperparameter",
        "hyperparameters.warmup_ratio",
    ),
    (
        {"hyperparameters": {"batch_size": 8, "micro_batch_size": 16}},
        "invalid_hyperparameter",
        "hyperparameters.micro_batch_size",
    ),
    (
        {"hyperparameters": {"batch_size": 12, "rollouts_per_prompt": 8}},
        "invalid_hyperparameter",
        "hyperparameters.batch_size",
    ),
    ({"hyperparameters": {"beta": 0.1}}, "invalid_hyperparameter", "hyperparameters.beta"),
    ({"hyperparameters": []}, "invalid_request", "hyperparameters"),
    ({"lora": {"rank": 8}}, "invalid_lora", "lora.rank"),
    ({"lora": {"r": 0}}, "invalid_lora", "lora.r"),
    ({"lora": {"target_modules": ["q_proj", "lm_head"]}}, "invalid_lora", "lora.target_modules"),
    ({"lora": {"quantization": "8bit"}}, "invalid_lora", "lora.quantization"),
    ({"region": "mars-1"}, "invalid_region", "region"),
    ({"region": "eu-central-1"}, "invalid_region", "region"),
    ({"provider": "digitalocean"}, "provider_not_configured", "provider"),
    ({"provider": "ibm"}, "invalid_provider", "provider"),
    ({"gpu_type": "TPU-v5"}, "invalid_gpu_type", "gpu_type"),
    ({"gpu_count": 9}, "invalid_gpu_count", "gpu_count"),
    ({"gpu_count": 0}, "invalid_gpu_count", "gpu_count"),
    ({"volumes": ["nope"]}, "invalid_volume", "volumes.0"),
    ({"resume_from": "ckpt_missing"}, "invalid_checkpoint", "resume_from"),
    ({"adapter_from": "ckpt_missing"}, "invalid_checkpoint", "adapter_from"),
    ({"dataset_id": "ds_missing"}, "invalid_dataset", "dataset_id"),
    ({"base_model": ""}, "invalid_base_model", "base_model"),
    ({"base_model": "not a model id!"}, "invalid_base_model", "base_model"),
    ({"base_model": 7}, "invalid_request", "base_model"),
    ({"base_model": "volume://nope/model"}, "invalid_volume", "base_model"),
    ({"base_model": "volume://nope/../../etc"}, "invalid_path", "base_model"),
    ({"base_model": "volume://bad name/x"}, "invalid_name", "base_model"),
    ({"base_model": "/etc"}, "invalid_base_model", "base_model"),  # never a folder of a machine
    ({"base_model": "../../.veri"}, "invalid_base_model", "base_model"),
    (
        {"reward_source": "x = " + "-" * 100_000 + "1\ndef reward(c):\n    return c\n"},
        "invalid_reward",
        "reward_source",
    ),
    (
        {"reward_source": "x = 1" + "+1" * 100_000 + "\ndef reward(c):\n    return c\n"},
        "invalid_reward",
        "reward_source",
    ),
    (
        {"hyperparameters": {"learning_rate": 2**62}},
        "invalid_hyperparameter",
        "hyperparameters.learning_rate",
    ),
    ({"lora": {"target_modules": ["q_proj\u0000"]}}, "invalid_lora", "lora.target_modules"),
    ({"checkpoint_every": 0}, "invalid_request", "checkpoint_every"),
    ({"heartbeat_timeout_seconds": 5}, "invalid_request", "heartbeat_timeout_seconds"),
    ({"max_launch_attempts": 0}, "invalid_request", "max_launch_attempts"),
    ({"gpu_count": "two"}, "invalid_request", "gpu_count"),
]


@pytest.mark.parametrize("overrides, code, field", BAD_SUBMISSIONS)
def test_bad_submissions_are_400_with_the_field(api_client, dataset, cloud, overrides, code, field):
    response = api_client.post("/v1/training_jobs", job_body(dataset, **overrides), format="json")
    assert_error(response, 400, code, field=field)
    assert not TrainingJob.objects.exists()


def test_region_list_is_in_the_message(api_client, dataset, cloud):
    error = assert_error(
        api_client.post("/v1/training_jobs", job_body(dataset, region="mars-1"), format="json"),
        400,
        "invalid_region",
    )
    assert "us-east-1, us-west-2, eu-west-1" in error["message"]


def test_unconfigured_provider_names_the_usable_ones(api_client, dataset, cloud):
    error = assert_error(
        api_client.post("/v1/training_jobs", job_body(dataset, provider="vast"), format="json"),
        400,
        "provider_not_configured",
    )
    assert "local" in error["message"] and "aws" in error["message"]


def test_qlora_needs_a_gpu(api_client, dataset, cloud):
    body = job_body(dataset, provider="local", gpu_type="cpu", lora={"quantization": "4bit"})
    assert_error(
        api_client.post("/v1/training_jobs", body, format="json"),
        400,
        "invalid_lora",
        field="lora.quantization",
    )


def test_dataset_rows_must_fit_the_method(api_client, dataset, cloud):
    error = assert_error(
        api_client.post("/v1/training_jobs", job_body(dataset, method="dpo"), format="json"),
        400,
        "invalid_dataset",
        field="dataset_id",
    )
    assert "line 1" in error["message"] and '"chosen"' in error["message"]


def test_volumes_must_be_in_the_jobs_region(api_client, dataset, cloud, workspace):
    volume_services.create_volume(workspace=workspace, name="west", region="us-west-2")
    body = job_body(dataset, volumes=["west"], region="us-east-1")
    assert_error(
        api_client.post("/v1/training_jobs", body, format="json"),
        400,
        "volume_region_mismatch",
        field="volumes",
    )
    # Without a region, the job goes where its volumes are.
    response = api_client.post(
        "/v1/training_jobs", job_body(dataset, volumes=["west"]), format="json"
    )
    assert response.status_code == 201 and response.json()["region"] == "us-west-2"


def test_another_workspaces_volume_and_dataset_cannot_be_used(api_client, dataset, cloud):
    other, _ = veri_services.create_workspace(name="other")
    volume_services.create_volume(workspace=other, name="theirs")
    assert_error(
        api_client.post("/v1/training_jobs", job_body(dataset, volumes=["theirs"]), format="json"),
        400,
        "invalid_volume",
        field="volumes.0",
    )
    from billing.services import open_billing_account

    open_billing_account(workspace=other, credit_micros=100_000_000)
    theirs = client_for(other).post("/v1/training_jobs", job_body(dataset), format="json")
    assert_error(theirs, 400, "invalid_dataset", field="dataset_id")


def test_local_provider_is_the_default_without_cloud_credentials(
    api_client, billed, settings, local_store_url
):
    settings.VERI_STORE = local_store_url
    dataset = upload_dataset(api_client, GRPO_ROWS)
    fill_volume(billed, "models", {"m/config.json": b"{}"})
    body = {
        "base_model": "volume://models/m",
        "dataset_id": dataset["id"],
        "method": "grpo",
        "reward_source": REWARD,
    }
    response = api_client.post("/v1/training_jobs", body, format="json")
    assert response.status_code == 201, response.json()
    assert (response.json()["provider"], response.json()["gpu_type"]) == ("local", "cpu")
    regions = api_client.get("/v1/regions").json()["data"]
    assert [r["code"] for r in regions if r["default"]] == ["us-east-1"]
    assert any(r["coming_soon"] for r in regions)
    gpus = api_client.get("/v1/gpus").json()["data"]
    assert {"provider": "local", "gpu_type": "cpu", "usable": True}.items() <= next(
        g for g in gpus if g["provider"] == "local"
    ).items()
    assert next(g for g in gpus if g["provider"] == "aws")["usable"] is False


def test_a_job_trains_on_from_a_checkpoints_adapter_named_by_its_id(
    api_client, dataset, cloud, workspace
):
    first = api_client.post("/v1/training_jobs", job_body(dataset), format="json").json()
    checkpoint = Checkpoint.objects.create(
        workspace=workspace,
        job=TrainingJob.objects.get(public_id=first["id"]),
        step=5,
        final=True,
        files=[{"path": "adapter_model.safetensors", "size": 1}],
    )
    body = job_body(dataset, adapter_from=checkpoint.public_id)
    response = api_client.post("/v1/training_jobs", body, format="json")
    assert response.status_code == 201, response.json()
    assert response.json()["adapter_from"] == checkpoint.public_id
    job = TrainingJob.objects.get(public_id=response.json()["id"])
    assert (job.adapter_from, job.resume_from) == (checkpoint, None)
    assert first["adapter_from"] is None

    # Another workspace's checkpoint is no checkpoint of theirs.
    other, _ = veri_services.create_workspace(name="other")
    from billing.services import open_billing_account

    open_billing_account(workspace=other, credit_micros=100_000_000)
    theirs = upload_dataset(client_for(other), GRPO_ROWS)
    answer = client_for(other).post(
        "/v1/training_jobs", job_body(theirs, adapter_from=checkpoint.public_id), format="json"
    )
    assert_error(answer, 400, "invalid_checkpoint", field="adapter_from")
