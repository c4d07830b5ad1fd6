"""Every endpoint that takes a path, customer or worker, on both stores: hostile forms are 400
`invalid_path` and write nothing; and the store itself refuses keys outside the caller's folder."""

import pytest

from tests.conftest import assert_error, client_for, fill_volume, put_to_url
from tests.training.conftest import GRPO_ROWS, job_body, upload_dataset, worker_client
from training import tasks
from training.models import Checkpoint, Dataset, TrainingJob
from veri import services as veri_services
from volumes.models import Upload, VolumeFile
from volumes.stores import KeyRefused, get_store, keys, store_for

pytestmark = pytest.mark.django_db

HOSTILE_PATHS = [
    "../escape.txt",
    "data/../../escape.txt",
    "/etc/passwd",
    "%2e%2e/escape.txt",
    "data%2F..%2F..%2Fescape.txt",
    "%252e%252e/escape.txt",
    "..\\escape.txt",
    "data\\..\\escape.txt",
    "nul\x00byte.txt",
    "data//file.txt",
    "./file.txt",
    "x" * 1000,
    "data/" + "y" * 300,
    "c1/a\u0085b",  # a C1 control character
    "evil\u202egnp.txt",  # a right-to-left override: shows as evil.png
    "a\u061cb",  # an Arabic letter mark (a text-direction mark too)
    "a\u2028b",  # a line separator
    "\ufeffa.txt",  # a byte-order mark
    "soft\u00adhyphen",
]


@pytest.fixture
def job_on_store(store_kind, api_client, billed, cloud):
    """A launched job on the store under test, with its worker's client."""
    dataset = upload_dataset(api_client, GRPO_ROWS)
    response = api_client.post("/v1/training_jobs", job_body(dataset), format="json")
    job = TrainingJob.objects.get(public_id=response.json()["id"])
    tasks.provision_job(job_id=job.pk)
    job.refresh_from_db()
    return job, worker_client(job)


@pytest.mark.parametrize("path", HOSTILE_PATHS)
def test_customer_upload_paths_are_refused(store_kind, api_client, workspace, path):
    volume = fill_volume(workspace, "corpus", {"ok.txt": b"ok"})
    single = api_client.post(
        f"/v1/volumes/{volume.public_id}/files", {"path": path, "size": 3}, format="json"
    )
    assert_error(single, 400, "invalid_path", "path")
    batch = api_client.post(
        f"/v1/volumes/{volume.public_id}/uploads:batch",
        {"files": [{"path": "fine.txt", "size": 1}, {"path": path, "size": 3}]},
        format="json",
    )
    assert_error(batch, 400, "invalid_path", "files.1.path")
    dataset = api_client.post(
        "/v1/datasets", {"source": "volume", "volume": "corpus", "path": path}, format="json"
    )
    assert_error(dataset, 400, "invalid_path", "path")
    listing = api_client.get(f"/v1/volumes/{volume.public_id}/files", {"prefix": path})
    if "\x00" in path:  # in a URL a NUL is refused before any view
        assert_error(listing, 400, "invalid_request")
    else:
        assert_error(listing, 400, "invalid_path", "prefix")
    assert Upload.objects.filter(volume=volume).count() == 1  # fill_volume's own
    assert list(VolumeFile.objects.values_list("path", flat=True)) == ["ok.txt"]
    assert not Dataset.objects.exists()


@pytest.mark.parametrize("path", HOSTILE_PATHS)
def test_submit_refuses_a_hostile_base_model_path(store_kind, api_client, billed, cloud, path):
    fill_volume(billed, "models", {"tiny/config.json": b"{}"})
    dataset = upload_dataset(api_client, GRPO_ROWS)
    body = job_body(dataset, base_model=f"volume://models/{path}")
    for url in ("/v1/training_jobs", "/v1/training_jobs/quote"):
        assert_error(api_client.post(url, body, format="json"), 400, "invalid_path", "base_model")
    assert not TrainingJob.objects.exists()


@pytest.mark.parametrize("path", HOSTILE_PATHS)
def test_worker_paths_are_refused(job_on_store, path):
    job, worker = job_on_store
    base = f"/v1/worker/jobs/{job.public_id}"
    for sent in (path, f"final/{path}", f"checkpoints/step-00000001/{path}"):
        answer = worker.post(f"{base}/output-credentials", {"paths": [sent]}, format="json")
        assert_error(answer, 400, "invalid_path", "paths.0")
        # The form the worker sends: files with the sha256 the store will hold them to.
        files = [{"path": "final/ok.bin", "sha256": "0" * 64}, {"path": sent, "sha256": "0" * 64}]
        answer = worker.post(f"{base}/output-credentials", {"files": files}, format="json")
        assert_error(answer, 400, "invalid_path", "files.1.path")
    for final in (False, True):
        answer = worker.post(
            f"{base}/checkpoints",
            {"step": 1, "final": final, "files": [{"path": path, "size": 3}]},
            format="json",
        )
        assert_error(answer, 400, "invalid_path", "files.0.path")
    assert not Checkpoint.objects.exists()


@pytest.mark.parametrize(
    "path",
    [
        "logs/stdout.txt",
        "final",
        "checkpoints/x/a.bin",
        "checkpoints/step-1/a.bin",
        "checkpoints/step-\u0660\u0660\u0660\u0660\u0660\u0660\u0660\u0662/a.bin",
        "a.bin",
    ],
)
def test_a_worker_writes_only_its_checkpoint_and_final_folders(job_on_store, path):
    job, worker = job_on_store
    answer = worker.post(
        f"/v1/worker/jobs/{job.public_id}/output-credentials", {"paths": [path]}, format="json"
    )
    assert_error(answer, 400, "invalid_path", "paths.0")


def test_a_checkpoint_cannot_point_at_another_workspaces_object(job_on_store, api_client):
    """The attack that worked: a checkpoint file whose path climbs into another workspace, then
    the job's owner asks for its download URL."""
    job, worker = job_on_store
    victim, _ = veri_services.create_workspace(name="victim")
    secret = fill_volume(victim, "secrets", {"weights.bin": b"theirs"})
    stolen_key = secret.store_prefix.key("weights.bin")
    climb = "../" * 6 + stolen_key
    answer = worker.post(
        f"/v1/worker/jobs/{job.public_id}/checkpoints",
        {"step": 0, "final": True, "files": [{"path": climb, "size": 6}]},
        format="json",
    )
    assert_error(answer, 400, "invalid_path")
    assert not Checkpoint.objects.exists()
    listed = api_client.get(f"/v1/training_jobs/{job.public_id}/checkpoints").json()["data"]
    assert listed == []


def test_a_good_checkpoint_still_registers(job_on_store, api_client):
    job, worker = job_on_store
    base = f"/v1/worker/jobs/{job.public_id}"
    answer = worker.post(
        f"{base}/output-credentials",
        {"paths": ["checkpoints/step-00000003/adapter.bin"]},
        format="json",
    ).json()
    assert put_to_url(worker, answer["files"][0]["url"], b"abc").status_code == 200
    registered = worker.post(
        f"{base}/checkpoints",
        {"step": 3, "files": [{"path": "adapter.bin", "size": 3}]},
        format="json",
    )
    assert registered.status_code == 201, registered.json()
    listed = api_client.get(f"/v1/training_jobs/{job.public_id}/checkpoints").json()["data"]
    assert [(c["step"], [f["path"] for f in c["files"]]) for c in listed] == [(3, ["adapter.bin"])]


def test_the_store_refuses_keys_outside_the_callers_folder(store_kind, workspace):
    """The second wall, on both stores: whatever a caller hands it, a store opened on a job's
    folder signs, reads and writes nothing outside that folder."""
    other, _ = veri_services.create_workspace(name="other")
    mine = keys.job_prefix(workspace.public_id, "job_mine")
    theirs = keys.volume_prefix(other.public_id, "vol_theirs").key("weights.bin")
    get_store().put_bytes(theirs, b"theirs")
    store = store_for(mine)
    for key in (
        theirs,
        mine.value + "../../../" + theirs,
        mine.value + "final/%2e%2e/x",
        mine.value.rstrip("/") + "2/x",  # a sibling whose name starts the same
        "/" + mine.value + "x",
    ):
        with pytest.raises(KeyRefused):
            store.presign_get(key, expires=60)
        with pytest.raises(KeyRefused):
            store.presign_put(key, expires=60)
        with pytest.raises(KeyRefused):
            store.put_bytes(key, b"x")
        with pytest.raises(KeyRefused):
            store.get_bytes(key)
        with pytest.raises(KeyRefused):
            store.stat_many([mine.key("ok.bin"), key])
    with pytest.raises(KeyRefused):
        store.delete_prefix(keys.workspace_prefix(other.public_id))
    store.put_bytes(mine.key("final/ok.bin"), b"ok")
    assert store.get_bytes(mine.key("final/ok.bin")) == b"ok"
    assert get_store().get_bytes(theirs) == b"theirs"


@pytest.mark.parametrize("key", ["../x", "a/../../x", "/abs", "a//b", "a\\b", "a\x00b"])
def test_both_stores_refuse_unsafe_keys_whoever_asks(store_kind, db, key):
    store = get_store()
    for call in (
        lambda: store.put_bytes(key, b"x"),
        lambda: store.presign_put(key, expires=60),
        lambda: store.presign_get(key, expires=60),
        lambda: store.head(key),
    ):
        with pytest.raises(KeyRefused):
            call()


def test_key_builders_take_only_ids_and_safe_paths():
    assert keys.volume_prefix("ws_a", "vol_b").key("data/x.jsonl") == (
        "workspaces/ws_a/volumes/vol_b/data/x.jsonl"
    )
    assert keys.checkpoint_prefix(keys.job_prefix("ws_a", "job_b"), step=40, final=False).value == (
        "workspaces/ws_a/jobs/job_b/checkpoints/step-00000040/"
    )
    for bad_id in ("../ws", "ws/x", "", "ws x"):
        with pytest.raises(KeyRefused):
            keys.workspace_prefix(bad_id)
    for bad_path in HOSTILE_PATHS:
        with pytest.raises(KeyRefused):
            keys.job_prefix("ws_a", "job_b").key(bad_path)


def test_another_workspaces_key_cannot_reach_this_workspaces_job(job_on_store):
    """A job token opens its own job only, even with another workspace's job id in the URL."""
    job, worker = job_on_store
    other, _ = veri_services.create_workspace(name="other")
    other_client = client_for(other)
    assert other_client.get(f"/v1/training_jobs/{job.public_id}/checkpoints").status_code == 404
    assert worker.get("/v1/worker/jobs/job_0000000000000000/spec").status_code == 404
