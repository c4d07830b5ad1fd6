"""Deleting a volume through the API empties its prefix in the store, done by a real qcluster."""

import time

import pytest
from django_q.models import Schedule

from tests.conftest import put_to_url
from volumes.models import StoreDeletion
from volumes.stores import get_store

# serialized_rollback: the schedules a migration wrote survive earlier tests' table flushes.
pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True, serialized_rollback=True)]


def test_a_deleted_volumes_prefix_is_gone_within_a_minute(
    api_client, qcluster, settings, s3_store_url
):
    settings.VERI_STORE = s3_store_url
    assert Schedule.objects.filter(func="volumes.tasks.reconcile_deleted_volumes").exists()
    ids = {}
    for name in ("data", "data2"):
        ids[name] = api_client.post("/v1/volumes", {"name": name}, format="json").json()["id"]
        files = [{"path": f"f{i}.txt", "size": 2} for i in range(3)]
        started = api_client.post(
            f"/v1/volumes/{ids[name]}/uploads:batch", {"files": files}, format="json"
        ).json()["data"]
        for answer in started:
            put_to_url(api_client, answer["url"], b"ok")
        api_client.post(
            f"/v1/volumes/{ids[name]}/uploads:complete",
            {"uploads": [{"upload_id": a["upload_id"]} for a in started]},
            format="json",
        )
    keys_before = [o.key for o in get_store().iter_objects("workspaces/")]
    assert len(keys_before) == 6

    qcluster()
    deleted_at = time.monotonic()
    assert api_client.delete(f"/v1/volumes/{ids['data']}?confirm=data").status_code == 204
    # The prefix empties first; the deletion row is marked done when the reconciler's
    # transaction commits, a moment later.
    while time.monotonic() - deleted_at < 60:
        remaining = [o.key for o in get_store().iter_objects("workspaces/")]
        marked = StoreDeletion.objects.filter(done_at__isnull=False).exists()
        if len(remaining) == 3 and marked:
            break
        time.sleep(0.5)
    print(f"prefix gone after {time.monotonic() - deleted_at:.1f}s")
    assert remaining == [k for k in keys_before if ids["data2"] in k]
    assert StoreDeletion.objects.get().done_at is not None
