"""A job's validation dataset: checked like the training dataset at submit, carried to the
worker's spec like it, and kept when the job is resumed."""

import pytest
from rest_framework.test import APIClient

from tests.conftest import assert_error
from tests.training.conftest import GRPO_ROWS, job_body, upload_dataset, worker_client
from training import tasks
from training.models import TrainingJob

pytestmark = pytest.mark.django_db


def test_a_validation_dataset_reaches_the_workers_spec(api_client, dataset, cloud):
    validation = upload_dataset(api_client, GRPO_ROWS[:2], name="valid.jsonl")
    body = job_body(dataset, validation_dataset_id=validation["id"])
    body["hyperparameters"] |= {"eval_interval": 2, "eval_samples": 10}
    response = api_client.post("/v1/training_jobs", body, format="json")
    assert response.status_code == 201, response.json()
    assert response.json()["validation_dataset_id"] == validation["id"]
    assert response.json()["hyperparameters"]["eval_interval"] == 2
    job = TrainingJob.objects.get(public_id=response.json()["id"])
    tasks.provision_job(job_id=job.pk)
    spec = worker_client(job).get(f"/v1/worker/jobs/{job.public_id}/spec").json()
    assert spec["validation_dataset"]["id"] == validation["id"]
    assert spec["validation_dataset"]["source"] == "upload"
    url = spec["validation_dataset"]["url"].removeprefix("http://testserver")
    assert APIClient().get(url).getvalue().count(b"\n") == 2
    without = api_client.post("/v1/training_jobs", job_body(dataset), format="json").json()
    assert without["validation_dataset_id"] is None


def test_a_validation_dataset_is_refused_like_the_training_dataset(
    api_client, other_api_client, dataset, cloud, settings, local_store_url
):
    def submit(validation_id: str):
        body = job_body(dataset, validation_dataset_id=validation_id)
        return api_client.post("/v1/training_jobs", body, format="json")

    error = assert_error(submit("ds_nope"), 400, "invalid_dataset", field="validation_dataset_id")
    assert "No dataset 'ds_nope'" in error["message"]
    theirs = upload_dataset(other_api_client, GRPO_ROWS)
    assert_error(submit(theirs["id"]), 400, "invalid_dataset", field="validation_dataset_id")
    chat = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}
    unfit = upload_dataset(api_client, [GRPO_ROWS[0], chat], name="unfit.jsonl")
    error = assert_error(submit(unfit["id"]), 400, "invalid_dataset", field="validation_dataset_id")
    assert error["message"] == (
        f"Dataset {unfit['id']} cannot train grpo: line 2 has messages ending with role "
        "'assistant'; a reinforcement row ends with a user or developer message, which the model "
        "answers."
    )
    assert not TrainingJob.objects.exists()
