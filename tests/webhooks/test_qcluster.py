"""The outbox end to end on a real task cluster: an event published in a transaction reaches the
endpoint once it commits, and a failed attempt is retried by the cluster's schedule."""

import os
import signal
import time

import openai
import pytest
from django.db import transaction
from django.utils import timezone
from django_q.models import Schedule

from tests.conftest import client_for, wait_for
from webhooks import services
from webhooks.models import WebhookDelivery

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True, serialized_rollback=True)]


def test_a_committed_event_is_delivered_and_a_failure_retried_by_the_cluster(
    qcluster, workspace, receiver
):
    endpoint = (
        client_for(workspace)
        .post("/v1/webhook_endpoints", {"url": receiver.url}, format="json")
        .json()
    )
    receiver.answers = [503]
    cluster = qcluster()
    with transaction.atomic():
        services.publish(
            workspace=workspace, event_type="fine_tuning.job.succeeded", data={"id": "ftjob-abc"}
        )
    with pytest.raises(RuntimeError), transaction.atomic():
        services.publish(workspace=workspace, event_type="training_job.failed", data={})
        raise RuntimeError("the publisher's change fails")

    delivery = WebhookDelivery.objects.get()  # the rolled-back event left nothing
    wait_for(lambda: delivery.attempts.exists(), 60, "the first attempt")
    # The every-minute sweep ran as the cluster started; the failed attempt set the retry 5 s on.
    # The sweep's next run is moved to now, as if that minute were over, and the cluster started
    # again: its scheduler's pass as it starts runs the sweep (a running cluster's next pass
    # would be up to 30 s away), which retries the delivery once due.
    os.killpg(cluster.pid, signal.SIGKILL)
    cluster.wait()
    Schedule.objects.filter(func="webhooks.tasks.deliver_due").update(next_run=timezone.now())
    delivery.refresh_from_db()
    time.sleep(max(0.0, (delivery.next_attempt_at - timezone.now()).total_seconds()))
    qcluster()
    wait_for(
        lambda: WebhookDelivery.objects.filter(pk=delivery.pk, delivered_at__isnull=False),
        150,
        "the retry",
    )
    assert len(receiver.requests) == 2
    request = receiver.requests[-1]
    event = openai.OpenAI(api_key="x", base_url="http://127.0.0.1:1").webhooks.unwrap(
        request["body"], request["headers"], secret=endpoint["signing_secret"]
    )
    assert (event.type, event.data.id) == ("fine_tuning.job.succeeded", "ftjob-abc")
    assert [a.status_code for a in delivery.attempts.order_by("pk")] == [503, 200]
