from billing.models import LedgerEntry, Refund
from training import tasks
from training.models import TrainingJob


def assert_provisioning_error(api_client, job: TrainingJob, *words: str) -> dict:
    """The launch ended as the platform's `provisioning_error`, in the provider's own words (each
    of `words` in the message), never as "no capacity"; nothing booted, so nothing is charged
    and there is nothing to refund."""
    tasks.settle_job(job_id=job.pk)
    body = api_client.get(f"/v1/training_jobs/{job.public_id}").json()
    assert body["status"] == "failed", body
    error = body["error"]
    assert (error["code"], error["attribution"]) == ("provisioning_error", "platform"), error
    for word in words:
        assert word in error["message"], error["message"]
    assert "capacity" not in error["message"].lower(), error["message"]
    assert body["cost_usd"] == "0.00" and body["refund"] is None, body
    assert not LedgerEntry.objects.filter(job=job).exists()
    assert not Refund.objects.filter(job=job).exists()
    return error
