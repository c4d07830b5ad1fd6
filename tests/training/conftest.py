import io
import json

import pytest
from rest_framework.test import APIClient

from training.models import TrainingJob
from training.services import jobs
from training.services.worker import mint_job_token

GRPO_ROWS = [{"prompt": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(8)]
REWARD = "def reward(completions, **kwargs):\n    return [float('4' in c) for c in completions]\n"


def upload_dataset(client: APIClient, rows: list[dict], name: str = "train.jsonl") -> dict:
    body = "".join(json.dumps(r) + "\n" for r in rows).encode()
    upload = io.BytesIO(body)
    upload.name = name
    response = client.post("/v1/datasets", {"file": upload}, format="multipart")
    assert response.status_code in (200, 201), response.json()  # 200: these bytes were uploaded
    return response.json()


@pytest.fixture
def dataset(api_client, billed, settings, local_store_url) -> dict:
    settings.VERI_STORE = local_store_url
    return upload_dataset(api_client, GRPO_ROWS)


def job_body(dataset: dict, **overrides) -> dict:
    body = {
        "base_model": "tiny/model",
        "dataset_id": dataset["id"],
        "method": "grpo",
        "reward_source": REWARD,
        "gpu_type": "L4-24GB",
        "provider": "aws",
        "hyperparameters": {"max_steps": 5},
    }
    return body | overrides


@pytest.fixture
def submit(api_client, dataset, cloud):
    def submit(**overrides) -> TrainingJob:
        response = api_client.post(
            "/v1/training_jobs", job_body(dataset, **overrides), format="json"
        )
        assert response.status_code == 201, response.json()
        return TrainingJob.objects.get(public_id=response.json()["id"])

    return submit


def worker_client(job: TrainingJob) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {mint_job_token(job=job)}")
    return client


def drive(job: TrainingJob, *statuses: str) -> TrainingJob:
    for status in statuses:
        jobs.transition_job(job_id=job.pk, to=status)
    job.refresh_from_db()
    return job
