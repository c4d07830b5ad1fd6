"""The worker's pieces that need no training: shipping through an outage, error classification,
reward loading, the disk check."""

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.conftest import free_port, serve_in_background
from worker.client import ControlPlane, ControlPlaneError, Shipper
from worker.errors import JobFailure
from worker.train import (
    SAMPLES_PER_STEP,
    SampleRecorder,
    classify,
    duration,
    load_rewards,
    load_rows,
    progress_line,
    set_adapter_base,
)
from worker.volumes import check_disk


class FlakyControlPlane(BaseHTTPRequestHandler):
    """Down (503) while `down` is set; records every log line and metric step it accepts."""

    down = threading.Event()
    lines: list[int] = []
    steps: list[int] = []

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if FlakyControlPlane.down.is_set():
            self.send_response(503)
            self.end_headers()
            return
        if self.path.endswith("/logs"):
            FlakyControlPlane.lines += [line["seq"] for line in body["lines"]]
        if self.path.endswith("/metrics"):
            FlakyControlPlane.steps += [p["step"] for p in body["points"]]
        payload = b'{"status": "running"}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args):
        pass


def test_logs_and_metrics_wait_out_an_outage_and_arrive_in_order():
    server = serve_in_background(ThreadingHTTPServer(("127.0.0.1", 0), FlakyControlPlane))
    api = ControlPlane(api_url=f"http://127.0.0.1:{server.server_port}", job_id="job_x", token="t")
    shipper = Shipper(api, interval=0.1, heartbeat_interval=0.1).start()
    try:
        FlakyControlPlane.down.set()
        for step in range(50):  # training goes on while the control plane is away
            shipper.line(f"step {step}")
            shipper.metrics(step, {"loss": 1.0})
        time.sleep(0.5)
        assert FlakyControlPlane.lines == []
        FlakyControlPlane.down.clear()
        shipper.close(timeout=10)
    finally:
        server.shutdown()
    assert FlakyControlPlane.lines == list(range(50))
    assert FlakyControlPlane.steps == list(range(50))


def test_errors_are_classified_into_the_catalog():
    import torch

    assert (
        classify(torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate"))[0] == "oom"
    )
    assert classify(ModuleNotFoundError("No module named 'flash_attn'"))[0] == "dependency_error"
    assert classify(JobFailure("config_error", "bad"))[0] == "config_error"
    code, message = classify(RuntimeError("something else"))
    assert (code, message) == ("training_error", "RuntimeError: something else")


def test_reward_sources_load_and_their_errors_are_training_errors(capsys):
    [marked] = load_rewards(
        "from veri_sdk import reward_function\n\n@reward_function\n"
        "def score(completions, **kw):\n    return [len(c) for c in completions]\n"
    )
    assert marked(prompts=["p", "q"], completions=["ab", "abc"]) == [2.0, 3.0]
    [raising] = load_rewards("def reward(completions, **kw):\n    raise KeyError('answer')\n")
    with pytest.raises(JobFailure) as failure:
        raising(prompts=["p"], completions=["x"])
    assert failure.value.code == "training_error" and "KeyError" in failure.value.message
    assert "Traceback" in capsys.readouterr().err
    with pytest.raises(JobFailure) as missing:
        load_rewards("import not_a_real_package\n")
    assert missing.value.code == "dependency_error"


def test_disk_check_refuses_volumes_over_80_percent_of_free_space(tmp_path):
    volumes = [{"total_bytes": 600}, {"total_bytes": 200}]
    check_disk(volumes, tmp_path, free_override=1000)  # exactly 80%: fits
    with pytest.raises(JobFailure) as refused:
        check_disk(volumes, tmp_path, free_override=999)
    assert (
        refused.value.code == "volume_too_large_for_node" and "800 bytes" in refused.value.message
    )


def s3_credentials(bucket: str, endpoint: str) -> dict:
    """What the control plane grants a worker to read a volume on S3 (STS credentials)."""
    return {
        "kind": "s3",
        "access_key_id": "testing",
        "secret_access_key": "testing",
        "session_token": "t",
        "expiration": "2099-01-01T00:00:00+00:00",
        "bucket": bucket,
        "endpoint_url": endpoint,
        "region": "us-east-1",
    }


@pytest.mark.parametrize(
    ("worth", "gain", "ranged"),
    [(0, 0, "probe and the rest"), (0, 1e9, "probe only"), (1e9, 0, "none")],
    ids=["split", "probe-only", "one-get"],
)
def test_s3_volume_sync_verifies_what_arrived(
    s3_endpoint, tmp_path, monkeypatch, worth, gain, ranged
):
    import contextlib
    import hashlib
    import os
    import time

    from tests.conftest import s3_client
    from worker import volumes
    from worker.volumes import sync_volume

    # A 40 MiB file in 8 MiB parts, its connection judged at once: slow enough to try a second
    # one (whose last-part GET then proves worth more, or not), or fast enough for one GET.
    monkeypatch.setattr(volumes, "SPLIT_ABOVE", 16 * 1024**2)
    monkeypatch.setattr(volumes, "PART_SIZE", 8 * 1024**2)
    monkeypatch.setattr(volumes, "PROBE_SECONDS", 0)
    monkeypatch.setattr(volumes, "SPLIT_WORTH_SECONDS", worth)
    monkeypatch.setattr(volumes, "SPLIT_GAIN", gain)
    asked, chunks = [], volumes.Fetcher.chunks

    def paced(stream):
        for chunk in stream:
            time.sleep(0.02)  # a slow connection: the second one's part lands before it passes
            yield chunk

    @contextlib.contextmanager
    def recording(self, file, start=None, end=None):
        asked.append((file["path"], start))
        with chunks(self, file, start, end) as stream:
            yield paced(stream) if start is None else stream

    monkeypatch.setattr(volumes.Fetcher, "chunks", recording)
    bucket = f"sync-test-{ranged}".replace(" ", "-")
    s3 = s3_client(s3_endpoint)
    s3.create_bucket(Bucket=bucket)
    blobs = {"small.txt": b"hello", "nested/big.bin": os.urandom(40 * 1024**2 + 1024)}
    files = []
    for path, data in blobs.items():
        s3.put_object(Bucket=bucket, Key=f"root/vol/{path}", Body=data)
        files.append(
            {
                "path": path,
                "size": len(data),
                "key": f"root/vol/{path}",
                "sha256": hashlib.sha256(data).hexdigest(),
            }
        )
    volume = {
        "name": "corpus",
        "file_count": 2,
        "total_bytes": sum(map(len, blobs.values())),
        "files": files,
        "credentials": s3_credentials(bucket, s3_endpoint),
    }
    mounted = sync_volume(None, volume, tmp_path, lambda _: None)
    for path, data in blobs.items():
        assert (mounted / path).read_bytes() == data
    part, last = 8 * 1024**2, 40 * 1024**2
    starts = sorted(start for path, start in asked if path == "nested/big.bin" and start)
    if ranged == "probe and the rest":  # the parts from a boundary past where the GET was, on
        assert len(starts) > 1 and starts == list(range(starts[0], last + 1, part)), starts
    else:
        assert starts == ([last] if ranged == "probe only" else [])

    s3.delete_object(Bucket=bucket, Key="root/vol/small.txt")
    (mounted / "small.txt").unlink()
    with pytest.raises(JobFailure) as incomplete:
        sync_volume(None, volume, tmp_path, lambda _: None)
    assert incomplete.value.code == "volume_sync_incomplete"
    assert "small.txt" in incomplete.value.message and "1 of 2 files" in incomplete.value.message

    # Bytes that changed in the store (same size) are caught by the hash taken as they arrive,
    # in one piece and in ranged parts alike.
    for path, data in blobs.items():
        s3.put_object(Bucket=bucket, Key=f"root/vol/{path}", Body=bytes(len(data)))
        (mounted / path).unlink(missing_ok=True)
    with pytest.raises(JobFailure) as corrupted:
        sync_volume(None, volume, tmp_path, lambda _: None)
    for path in blobs:
        assert f"{path} (sha256 differs from the uploaded file's)" in corrupted.value.message


def test_the_files_of_a_pack_come_in_one_ranged_get(s3_endpoint, tmp_path, monkeypatch):
    import contextlib
    import hashlib

    from tests.conftest import s3_client
    from worker import volumes
    from worker.volumes import sync_volume

    asked, chunks = [], volumes.Fetcher.chunks

    @contextlib.contextmanager
    def recording(self, file, start=None, end=None):
        asked.append((file["offset"], file["size"]))
        with chunks(self, file, start, end) as stream:
            yield stream

    monkeypatch.setattr(volumes.Fetcher, "chunks", recording)
    s3 = s3_client(s3_endpoint)
    s3.create_bucket(Bucket="pack-sync")
    blobs = {"a.txt": b"alpha", "b/b.txt": b"bravo!", "c.txt": b"charlie", "d.txt": b"delta"}
    s3.put_object(Bucket="pack-sync", Key="vol/packs/x/0", Body=b"HEAD" + b"".join(blobs.values()))
    files, offset = [], 4  # bytes before a.txt: the pack's files not in this volume any more
    for path, data in blobs.items():
        files.append(
            {
                "path": path,
                "size": len(data),
                "sha256": hashlib.sha256(data).hexdigest(),
                "object_key": "packs/x/0",
                "key": "vol/packs/x/0",
                "offset": offset,
            }
        )
        offset += len(data)
    volume = {
        "name": "corpus",
        "file_count": 4,
        "total_bytes": sum(map(len, blobs.values())),
        "files": files,
        "credentials": s3_credentials("pack-sync", s3_endpoint),
    }
    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "c.txt").write_bytes(b"charlie")  # there from an earlier run
    mounted = sync_volume(None, volume, tmp_path, lambda _: None)
    assert {path: (mounted / path).read_bytes() for path in blobs} == blobs
    assert asked == [(4, 5 + 6 + 7 + 5)]  # a.txt to d.txt, c.txt's bytes passed over

    # Other bytes of the same length in the pack: each file's hash, taken as it arrived, tells.
    s3.put_object(Bucket="pack-sync", Key="vol/packs/x/0", Body=bytes(4 + 23))
    for path in ("a.txt", "d.txt"):
        (mounted / path).unlink()
    with pytest.raises(JobFailure) as corrupted:
        sync_volume(None, volume, tmp_path, lambda _: None)
    for path in ("a.txt", "d.txt"):
        assert f"{path} (sha256 differs from the uploaded file's)" in corrupted.value.message
    assert "b/b.txt" not in corrupted.value.message


def test_one_readable_progress_line_per_step():
    values = {"loss": 0.41234, "reward": 0.37, "learning_rate": 0.01, "num_tokens": 12.0}
    assert progress_line(12, 60, values, 3.1) == (
        "step 12/60  loss 0.4123  reward 0.37  lr 0.01  3.1 s/step  eta 2m29s"
    )
    assert progress_line(60, 60, {"loss": 0.2}, 3.1) == "step 60/60  loss 0.2  3.1 s/step"
    assert duration(7300) == "2h01m" and duration(42) == "42s"


def test_a_saved_adapter_names_the_base_model_as_the_customer_did(tmp_path):
    (tmp_path / "adapter_config.json").write_text(
        json.dumps({"base_model_name_or_path": "/tmp/veri-x/mnt/corpus/models/m", "r": 8})
    )
    (tmp_path / "README.md").write_text("---\nbase_model: /tmp/veri-x/mnt/corpus/models/m\n---\n")
    spec = {
        "base_model": "volume://corpus/models/m",
        "model_path": "/tmp/veri-x/mnt/corpus/models/m",
    }
    set_adapter_base(tmp_path, spec)
    config = json.loads((tmp_path / "adapter_config.json").read_text())
    assert config == {"base_model_name_or_path": "volume://corpus/models/m", "r": 8}
    assert "base_model: volume://corpus/models/m" in (tmp_path / "README.md").read_text()


def test_shipped_batches_stay_under_the_body_limit_and_lines_are_cleaned():
    sent = []

    class Recorder:
        def call(self, method, path, *, json=None, attempts=1):
            sent.append(json)
            return {}

    shipper = Shipper(Recorder(), heartbeat_interval=3600)
    for _ in range(300):
        shipper.line("x" * 100_000)
    shipper.line("bin\x00ary")
    while not shipper.flush():
        pass
    log_batches = [body["lines"] for body in sent if body and "lines" in body]
    assert all(sum(len(line["text"]) for line in batch) <= 1024**2 for batch in log_batches)
    shipped = [line for batch in log_batches for line in batch]
    assert [line["seq"] for line in shipped] == list(range(301))
    assert len(shipped[0]["text"]) == Shipper.MAX_LINE_CHARS
    assert shipped[-1]["text"] == "bin\ufffdary"


def test_lines_stop_being_sent_once_the_control_plane_says_the_log_is_full():
    """`/logs` answers `log_truncated: true` once the job's log reached VERI_MAX_LOG_BYTES: the
    control plane drops every later line, so the worker stops sending them."""
    sent = []

    class ControlPlaneWithAFullLog:
        def call(self, method, path, *, json=None, attempts=1):
            sent.append((path, json))
            return {"added": 0, "log_truncated": True} if path == "/logs" else {}

    shipper = Shipper(ControlPlaneWithAFullLog(), heartbeat_interval=3600)
    for n in range(3):
        shipper.line(f"line {n}")
    shipper.metrics(1, {"loss": 0.5})
    assert shipper.flush()
    for n in range(3, 10):
        shipper.line(f"line {n}")
    shipper.metrics(2, {"loss": 0.4})
    assert shipper.flush()
    assert [path for path, _ in sent if path != "/heartbeat"] == ["/logs", "/metrics", "/metrics"]
    assert shipper.dropped == 7


def test_a_dataset_id_that_names_a_local_folder_is_refused(tmp_path, monkeypatch):
    """`datasets.load_dataset` reads a local folder of that name: a worker never does."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "secrets").mkdir()
    spec = {"method": "sft_text", "dataset": {"source": "hf", "repo": "secrets"}}
    with pytest.raises(JobFailure) as failure:
        load_rows(spec)
    assert failure.value.code == "config_error"


def test_samples_carry_each_reward_functions_score_every_n_steps():
    sent = []

    class Recorded:
        def emit(self, kind, **data):
            sent.append((kind, data))

    recorder = SampleRecorder(Recorded(), every=2)
    length, has_a = load_rewards(
        "from veri_sdk import reward_function\n\n"
        "@reward_function\ndef length(completions, **kw):\n"
        "    return [len(c) for c in completions]\n"
        "@reward_function\ndef has_a(completions, **kw):\n"
        "    return [float('a' in c) for c in completions]\n",
        recorder,
    )
    for step in (1, 2):
        recorder.step = step
        prompts = [[{"role": "user", "content": "say"}]] * 6
        length(prompts=prompts, completions=["a", "bb", "ccc", "aaaa", "e", "f"])
        has_a(prompts=prompts, completions=["a", "bb", "ccc", "aaaa", "e", "f"])
    [(kind, data)] = sent  # step 1 is not a sampled step; step 2 is, once
    assert (kind, data["step"], len(data["samples"])) == ("samples", 2, SAMPLES_PER_STEP)
    first = data["samples"][0]
    assert first["prompt"] == "say" and first["completion"] == "a"
    assert first["rewards"] == {"length": 1.0, "has_a": 1.0} and first["reward"] == 2.0


def test_a_call_waits_out_a_control_plane_restart_within_its_patience(monkeypatch):
    """The worker used to give up after about 2 minutes of a control plane being restarted (its
    training done, the result unreported), and the job was later failed as the customer's
    heartbeat_timeout. Now a call keeps trying for VERI_WORKER_API_PATIENCE_SECONDS."""
    port = free_port()
    api = ControlPlane(api_url=f"http://127.0.0.1:{port}", job_id="job_x", token="t")
    monkeypatch.setenv("VERI_WORKER_API_PATIENCE_SECONDS", "1")
    with pytest.raises(ControlPlaneError, match="unreachable"):
        api.call("POST", "/complete", json={"ok": True})

    monkeypatch.setenv("VERI_WORKER_API_PATIENCE_SECONDS", "60")
    FlakyControlPlane.down.clear()
    servers = []
    back = threading.Timer(
        2.5,
        lambda: servers.append(
            serve_in_background(ThreadingHTTPServer(("127.0.0.1", port), FlakyControlPlane))
        ),
    )
    back.start()
    try:
        assert api.call("POST", "/complete", json={"ok": True}) == {"status": "running"}
    finally:
        back.join()
        for server in servers:
            server.shutdown()
