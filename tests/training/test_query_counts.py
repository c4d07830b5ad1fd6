"""The database queries a request makes do not grow with the workspace's jobs or files (what
bench/control_plane.py measures under load, through `Veri-Db-Queries`)."""

import time

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from tests.conftest import fill_volume
from tests.training.conftest import job_body

pytestmark = pytest.mark.django_db


def queries(call) -> int:
    call()  # once before: the API key's last use is stamped on a key's first request of a while
    with CaptureQueriesContext(connection) as captured:
        response = call()
    assert response.status_code in (200, 201), response.json()
    return len(captured)


def test_submit_and_listing_jobs_take_the_same_queries_for_1_or_12_jobs(api_client, dataset, cloud):
    submit = lambda: api_client.post("/v1/training_jobs", job_body(dataset), format="json")  # noqa: E731
    first = queries(submit)
    listing_one = queries(lambda: api_client.get("/v1/training_jobs"))
    for _ in range(10):
        submit()
    assert queries(submit) == first
    assert queries(lambda: api_client.get("/v1/training_jobs")) == listing_one


def test_upload_starts_and_file_listings_take_the_same_queries_for_few_or_many_files(
    api_client, workspace, store_kind
):
    fill_volume(workspace, "data", {"a.bin": b"a"})
    start = lambda n: api_client.post(  # noqa: E731
        "/v1/volumes/data/files",
        {"path": f"new/{n}-{time.monotonic_ns()}.bin", "size": 10},
        format="json",
    )
    batch = lambda n, count: api_client.post(  # noqa: E731
        "/v1/volumes/data/uploads:batch",
        {
            "files": [
                {"path": f"batch-{n}-{time.monotonic_ns()}/{i}.bin", "size": 10}
                for i in range(count)
            ]
        },
        format="json",
    )
    listing = lambda: api_client.get("/v1/volumes/data/files")  # noqa: E731
    one_start, one_listing = queries(lambda: start(0)), queries(listing)
    small_batch = queries(lambda: batch(0, 2))
    fill_volume(workspace, "data", {f"more/{i}.bin": b"x" for i in range(60)})
    assert queries(lambda: start(2)) == one_start
    assert queries(listing) == one_listing
    # A full batch; SQLite splits a bulk insert of more than ~90 rows into several statements.
    full = 500 if connection.vendor == "postgresql" else 60
    assert queries(lambda: batch(2, full)) == small_batch
