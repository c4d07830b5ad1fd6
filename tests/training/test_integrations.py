"""A job's W&B integration: checked at submit, refused without the workspace's WANDB_API_KEY
(unless this deployment logs W&B offline), and handed to the runner with the key, in its spec."""

import pytest

from tests.conftest import assert_error
from tests.training.conftest import job_body, worker_client
from training.models import Checkpoint, TrainingJob
from veri import services as veri_services

pytestmark = pytest.mark.django_db

WANDB = [{"type": "wandb", "wandb": {"project": "veri-runs", "tags": ["sft", "tiny"]}}]
KEY = "wandb-key-canary-0123456789"


def post(api_client, dataset, **overrides):
    return api_client.post("/v1/training_jobs", job_body(dataset, **overrides), format="json")


def test_a_wandb_job_without_the_key_is_refused_with_how_to_set_it(
    api_client, dataset, cloud, settings
):
    settings.VERI_WANDB_MODE = "online"
    error = assert_error(
        post(api_client, dataset, integrations=WANDB), 400, "missing_secret", "integrations"
    )
    assert "WANDB_API_KEY" in error["message"]
    assert "veri secrets set WANDB_API_KEY" in error["message"]
    assert not TrainingJob.objects.exists()


def test_with_the_key_the_runner_gets_it_and_the_job_answers_without_it(
    api_client, dataset, cloud, settings, workspace
):
    settings.VERI_WANDB_MODE = "online"
    veri_services.set_secret(workspace=workspace, name="WANDB_API_KEY", value=KEY)
    response = post(api_client, dataset, integrations=WANDB)
    assert response.status_code == 201, response.json()
    assert response.json()["integrations"] == [
        {
            "type": "wandb",
            "wandb": {
                "project": "veri-runs",
                "name": None,
                "entity": None,
                "tags": ["sft", "tiny"],
            },
        }
    ]
    job = TrainingJob.objects.get(public_id=response.json()["id"])
    assert KEY not in api_client.get(f"/v1/training_jobs/{job.public_id}").content.decode()
    spec = worker_client(job).get(f"/v1/worker/jobs/{job.public_id}/spec").json()
    assert spec["integrations"] == response.json()["integrations"]
    assert (spec["secrets"], spec["wandb_mode"]) == ({"WANDB_API_KEY": KEY}, "online")


def test_offline_mode_needs_no_key_and_a_job_without_integrations_gets_no_secret(
    api_client, dataset, cloud, settings, workspace
):
    settings.VERI_WANDB_MODE = "offline"
    job_id = post(api_client, dataset, integrations=WANDB).json()["id"]
    job = TrainingJob.objects.get(public_id=job_id)
    spec = worker_client(job).get(f"/v1/worker/jobs/{job_id}/spec").json()
    assert (spec["secrets"], spec["wandb_mode"]) == ({}, "offline")
    # A workspace's key goes only to the jobs that report to W&B.
    veri_services.set_secret(workspace=workspace, name="WANDB_API_KEY", value=KEY)
    plain = TrainingJob.objects.get(public_id=post(api_client, dataset).json()["id"])
    assert plain.integrations == []
    spec = worker_client(plain).get(f"/v1/worker/jobs/{plain.public_id}/spec").json()
    assert spec["secrets"] == {}


@pytest.mark.parametrize(
    ("integrations", "field"),
    [
        ({"type": "wandb"}, "integrations"),
        ([{"type": "mlflow", "mlflow": {}}], "integrations[0].type"),
        ([{"type": "wandb", "wandb": {}}], "integrations[0].wandb.project"),
        ([{"type": "wandb", "wandb": {"project": 3}}], "integrations[0].wandb.project"),
        ([{"type": "wandb", "wandb": {"project": "p", "name": ""}}], "integrations[0].wandb.name"),
        (
            [{"type": "wandb", "wandb": {"project": "p", "tags": ["x"] * 51}}],
            "integrations[0].wandb.tags",
        ),
        (
            [{"type": "wandb", "wandb": {"project": "p", "tags": ["x" * 65]}}],
            "integrations[0].wandb.tags",
        ),
        (
            [{"type": "wandb", "wandb": {"project": "p", "colour": "red"}}],
            "integrations[0].wandb.colour",
        ),
        ([{"type": "wandb", "wandb": "p"}], "integrations[0].wandb"),
    ],
)
def test_malformed_integrations_are_refused_naming_the_field(
    api_client, dataset, cloud, settings, integrations, field
):
    settings.VERI_WANDB_MODE = "offline"
    assert_error(
        post(api_client, dataset, integrations=integrations), 400, "invalid_request", field
    )


def test_a_resumed_job_keeps_reporting_to_wandb(api_client, dataset, cloud, settings):
    settings.VERI_WANDB_MODE = "offline"
    job = TrainingJob.objects.get(
        public_id=post(api_client, dataset, integrations=WANDB).json()["id"]
    )
    Checkpoint.objects.create(
        workspace=job.workspace, job=job, step=2, files=[{"path": "a.bin", "size": 1}]
    )
    resumed = api_client.post(f"/v1/training_jobs/{job.public_id}/resume", {}, format="json")
    assert resumed.status_code == 201, resumed.json()
    assert resumed.json()["integrations"] == job.integrations != []


def test_a_key_sealed_under_an_old_secret_key_leaves_the_spec_whole(
    api_client, dataset, cloud, settings, workspace
):
    settings.VERI_WANDB_MODE = "online"
    veri_services.set_secret(workspace=workspace, name="WANDB_API_KEY", value=KEY)
    job = TrainingJob.objects.get(
        public_id=post(api_client, dataset, integrations=WANDB).json()["id"]
    )
    client = worker_client(job)
    settings.SECRET_KEY = "rotated-" + settings.SECRET_KEY
    answer = client.get(f"/v1/worker/jobs/{job.public_id}/spec")
    assert answer.status_code == 200 and answer.json()["secrets"] == {}
