"""A real job on an S3 store without STS (as Runpod's): the worker mounts the base model's volume
through presigned GET URLs and uploads its checkpoints and final model through presigned PUTs,
and nothing asks STS for credentials."""

import pytest

from billing.services import open_billing_account
from tests.conftest import fill_volume
from tests.e2e.test_training import (
    SFT_ROWS,
    TINY,
    assert_loads_and_generates,
    download_final,
    submit,
    wait_settled,
)

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True, serialized_rollback=True)]


def test_a_real_job_trains_on_an_s3_store_without_sts(
    api_client, workspace, live_server, qcluster, tmp_path, no_sts, tiny_model
):
    open_billing_account(workspace=workspace, credit_micros=100_000_000)
    fill_volume(
        workspace,
        "models",
        {f"tiny/{p.name}": p.read_bytes() for p in tiny_model.iterdir() if p.is_file()},
    )
    qcluster(
        VERI_PUBLIC_URL=live_server.url,
        VERI_LOCAL_INSTANCES_DIR=str(tmp_path / "instances"),
        VERI_STS_ROLE_ARN="",
    )
    job_id = submit(
        api_client,
        SFT_ROWS,
        base_model=TINY,
        method="sft_text",
        checkpoint_every=1,
        hyperparameters={"max_steps": 2, "batch_size": 8, "max_seq_length": 64},
    )
    job = wait_settled(job_id)
    assert job.status == "completed", (job.error_code, job.error_message)
    full = api_client.get(f"/v1/training_jobs/{job_id}/logs/full").getvalue().decode()
    assert "[veri] mounted models" in full
    checkpoints = api_client.get(f"/v1/training_jobs/{job_id}/checkpoints").json()["data"]
    assert any(not c["final"] for c in checkpoints)
    assert_loads_and_generates(download_final(api_client, job_id, tmp_path / "final"), tiny_model)
    assert no_sts == []
