"""The `veri` CLI and the SDK against a live control plane (and the moto S3 server)."""

import json
import os
import re
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from billing import services as billing
from billing.models import LedgerEntry
from tests.conftest import free_port, serve_in_background
from tests.sdk.faults import FaultyProxy
from veri_sdk import Client, ConnectionFailed, NotFoundError
from veri_sdk.cli import main, output
from volumes.models import Volume, VolumeFile
from volumes.stores import get_store

pytestmark = pytest.mark.django_db(transaction=True)


def make_tree(root, count: int = 12) -> dict[str, bytes]:
    files = {
        f"part-{i:02d}.jsonl": f'{{"text": "row {i}"}}\n'.encode() * (i + 1) for i in range(count)
    }
    files["nested/deeper/notes.txt"] = b"notes"
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    return files


def test_upload_dir_twice_uploads_nothing_the_second_time(
    cli, capsys, tmp_path, settings, local_store_url
):
    settings.VERI_STORE = local_store_url
    files = make_tree(tmp_path / "corpus", count=300)  # started and completed in three batches
    assert cli("volumes", "create", "corpus", capsys=capsys)[0] == 0
    code, out, err = cli("volumes", "upload-dir", "corpus", str(tmp_path / "corpus"), capsys=capsys)
    assert code == 0, err
    assert f"Uploaded {len(files)} file(s)" in out
    volume = Volume.objects.get(name="corpus")
    assert (volume.file_count, volume.total_bytes) == (len(files), sum(map(len, files.values())))
    for file in VolumeFile.objects.filter(volume=volume):
        assert (
            get_store().get_bytes(file.object_key, byte_range=file.byte_range) == files[file.path]
        )

    code, out, err = cli("volumes", "upload-dir", "corpus", str(tmp_path / "corpus"), capsys=capsys)
    assert code == 0
    assert f"Nothing to upload: all {len(files)} file(s) are already in corpus." in out
    assert err == ""  # no empty progress bar
    assert VolumeFile.objects.filter(volume=volume).count() == len(files)

    (tmp_path / "corpus" / "part-00.jsonl").write_bytes(b"changed\n")
    code, out, _ = cli("volumes", "upload-dir", "corpus", str(tmp_path / "corpus"), capsys=capsys)
    assert "Uploaded 1 file(s)" in out and f"skipped {len(files) - 1}" in out

    (tmp_path / "empty").mkdir()
    code, out, err = cli("volumes", "upload-dir", "corpus", str(tmp_path / "empty"), capsys=capsys)
    assert code == 0 and f"Nothing to upload: {tmp_path / 'empty'} holds no files." in out

    code, out, _ = cli("volumes", "ls", "corpus", "--prefix", "nested/", capsys=capsys)
    assert "nested/deeper/notes.txt" in out and "part-00" not in out
    code, out, _ = cli("volumes", "list", capsys=capsys)
    assert "corpus" in out and volume.public_id in out


def test_multipart_upload_through_the_cli_to_s3(cli, capsys, tmp_path, settings, s3_store_url):
    settings.VERI_STORE = s3_store_url
    settings.VERI_MULTIPART_THRESHOLD = 5 * 1024**2
    settings.VERI_MULTIPART_PART_SIZE = 5 * 1024**2
    source = tmp_path / "weights.bin"
    source.write_bytes(os.urandom(17 * 1024**2))
    code, out, err = cli(
        "volumes", "upload", "models", str(source), "--path", "qwen/weights.bin", capsys=capsys
    )
    assert code == 1 and "No volume 'models'" in err  # no such volume yet
    cli("volumes", "create", "models", capsys=capsys)
    code, out, err = cli(
        "volumes", "upload", "models", str(source), "--path", "qwen/weights.bin", capsys=capsys
    )
    assert code == 0, err
    assert "Uploaded qwen/weights.bin (17.0 MiB)" in out
    assert "17.0/17.0 MiB" in err  # the progress bar's final state
    file = VolumeFile.objects.get(path="qwen/weights.bin")
    assert file.size == 17 * 1024**2
    assert get_store().get_bytes(file.object_key) == source.read_bytes()


def test_single_uploads_send_the_signed_headers_to_s3_and_the_file_cannot_be_rewritten(
    cli, capsys, tmp_path, settings, s3_store_url
):
    """A single PUT carries the headers its URL was signed with (checksum, create-only): the
    upload works, and its URL cannot write the file again afterwards."""
    settings.VERI_STORE = s3_store_url
    source = tmp_path / "train.jsonl"
    source.write_bytes(b'{"text": "row"}\n' * 100)
    cli("volumes", "create", "corpus", capsys=capsys)
    code, out, err = cli("volumes", "upload", "corpus", str(source), capsys=capsys)
    assert code == 0, err
    file = VolumeFile.objects.get(path="train.jsonl")
    assert get_store().get_bytes(file.object_key) == source.read_bytes()
    store = get_store()
    url, headers = store.presign_put(file.object_key, expires=60, create_only=True)
    assert httpx.put(url, content=b"other", headers=headers).status_code == 412
    assert get_store().get_bytes(file.object_key) == source.read_bytes()


def test_a_put_whose_answer_was_lost_is_retried_and_counts_as_stored(
    cli, capsys, tmp_path, settings, local_store_url, live_server
):
    """The store wrote the bytes, then the connection dropped: the retry finds the object there
    (412 to its create-only URL), which is this same upload's bytes, so the upload completes."""
    settings.VERI_STORE = local_store_url
    proxy = FaultyProxy(live_server.url)
    settings.VERI_PUBLIC_URL = proxy.url  # the local store's signed URLs go through the proxy
    try:
        proxy.add("/v1/store/", "drop")
        client = Client(api_key=cli.key, base_url=proxy.url)
        client.volumes.create("corpus")
        source = tmp_path / "notes.txt"
        source.write_bytes(b"written once\n")
        client.volumes.upload_file("corpus", str(source))
        assert proxy.count("/v1/store/", "PUT") == 2
    finally:
        proxy.close()
    file = VolumeFile.objects.get(path="notes.txt")
    assert (file.size, get_store().get_bytes(file.object_key)) == (13, b"written once\n")


def test_delete_asks_for_the_name_unless_yes(
    cli, capsys, tmp_path, settings, local_store_url, monkeypatch
):
    settings.VERI_STORE = local_store_url
    make_tree(tmp_path / "d", count=2)
    cli("volumes", "create", "scratch", capsys=capsys)
    cli("volumes", "upload-dir", "scratch", str(tmp_path / "d"), capsys=capsys)

    monkeypatch.setattr("builtins.input", lambda prompt: "not-it")
    code, _, err = cli("volumes", "delete", "scratch", capsys=capsys)
    assert code == 1 and "holds 3 file(s)" in err and "Not deleted" in err
    assert Volume.objects.filter(name="scratch").exists()

    monkeypatch.setattr("builtins.input", lambda prompt: "scratch")
    assert cli("volumes", "delete", "scratch", capsys=capsys)[0] == 0
    assert not Volume.objects.filter(name="scratch").exists()

    cli("volumes", "create", "scratch", capsys=capsys)
    monkeypatch.setattr("builtins.input", lambda prompt: pytest.fail("--yes must not prompt"))
    code, out, _ = cli("volumes", "delete", "scratch", "--yes", capsys=capsys)
    assert code == 0 and "Deleted volume scratch" in out


def test_exit_codes(cli, capsys):
    with pytest.raises(SystemExit) as usage:
        main(["volumes", "create"])  # missing NAME
    assert usage.value.code == 2
    code, _, err = cli("volumes", "create", "bad name", capsys=capsys)
    assert code == 1 and "Volume names are" in err
    code, _, err = cli("--api-key", "veri_sk_nope_nope", "volumes", "list", capsys=capsys)
    assert code == 1 and "not valid" in err


def test_login_saves_url_and_key_for_later_commands(
    cli, capsys, monkeypatch, live_server, tmp_path
):
    monkeypatch.delenv("VERI_API_KEY")
    monkeypatch.delenv("VERI_API_URL")
    code, out, _ = cli("login", "--api-url", live_server.url, "--api-key", cli.key, capsys=capsys)
    assert code == 0
    saved = json.loads((tmp_path / "config" / "veri" / "config.json").read_text())
    assert saved == {"api_url": live_server.url, "api_key": cli.key}
    assert oct((tmp_path / "config" / "veri" / "config.json").stat().st_mode)[-3:] == "600"
    assert cli("volumes", "create", "after-login", capsys=capsys)[0] == 0
    assert Client().volumes.get("after-login").name == "after-login"


def test_sdk_errors_are_typed(cli, settings, local_store_url):
    client = Client()
    with pytest.raises(NotFoundError) as missing:
        client.volumes.get("nope")
    assert (missing.value.status, missing.value.code) == (404, "not_found")
    client.volumes.create("keep")
    with pytest.raises(Exception) as refused:
        client.volumes.delete("keep")
    assert refused.value.code == "confirmation_required"
    assert refused.value.extra == {"file_count": 0, "total_bytes": 0}


class FlakyApi(BaseHTTPRequestHandler):
    """Answers 503, then 409 `idempotency_in_progress` (the first attempt still working), then
    201; remembers each Idempotency-Key."""

    keys: list[str] = []

    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        FlakyApi.keys.append(self.headers["Idempotency-Key"])
        status = {1: 503, 2: 409}.get(len(FlakyApi.keys), 201)
        body = (
            {"error": {"code": "unavailable" if status == 503 else "idempotency_in_progress"}}
            if status != 201
            else {
                "id": "vol_1",
                "name": "x",
                "region": "us-east-1",
                "status": "ready",
                "file_count": 0,
                "total_bytes": 0,
                "created_at": "2026-01-01T00:00:00Z",
            }
        )
        payload = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        if status != 201:
            self.send_header("Retry-After", "0")
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args):
        pass


def test_sdk_retries_5xx_and_a_busy_key_with_one_idempotency_key_and_gives_up_on_dead_hosts():
    server = ThreadingHTTPServer(("127.0.0.1", 0), FlakyApi)
    serve_in_background(server)
    try:
        client = Client(api_key="k", base_url=f"http://127.0.0.1:{server.server_port}")
        assert client.volumes.create("x").id == "vol_1"
    finally:
        server.shutdown()
    assert len(FlakyApi.keys) == 3 and len(set(FlakyApi.keys)) == 1

    dead = Client(api_key="k", base_url=f"http://127.0.0.1:{free_port()}", max_retries=1)
    with pytest.raises(ConnectionFailed):
        dead.volumes.list()


def test_without_credentials_the_cli_says_how_to_log_in(cli, capsys, monkeypatch):
    monkeypatch.delenv("VERI_API_KEY")
    code, _, err = cli("volumes", "list", capsys=capsys)
    assert code == 1
    assert "No API key" in err and "veri login" in err and "VERI_API_KEY" in err
    monkeypatch.setenv("VERI_API_KEY", "veri_sk_aaaa_bbbb")
    monkeypatch.setenv("VERI_API_URL", f"http://127.0.0.1:{free_port()}")  # nothing listens
    code, _, err = cli("volumes", "list", capsys=capsys)
    assert code == 1
    assert "Is the API server running there?" in err and "veri login" in err
    monkeypatch.setenv("VERI_API_URL", cli.url)
    code, _, err = cli("volumes", "list", capsys=capsys)
    assert code == 1 and "not valid" in err and "veri login" in err


def test_tables_never_cut_ids_or_paths(
    cli, capsys, settings, local_store_url, tmp_path, monkeypatch
):
    """On an 80-column terminal the other columns wrap: an id or a path is printed whole, on one
    line (rich used to fold an id over two lines there, or cut it with an ellipsis)."""
    monkeypatch.setattr(output.out, "width", 80)
    settings.VERI_STORE = local_store_url
    name = "a-volume-name-long-enough-to-push-an-eighty-column-table-past-its-edge"
    assert cli("volumes", "create", name, capsys=capsys)[0] == 0
    deep = tmp_path / "tree" / ("folder-" * 12) / "file-with-a-long-name.jsonl"
    deep.parent.mkdir(parents=True)
    deep.write_text("{}\n")
    assert cli("volumes", "upload-dir", name, str(tmp_path / "tree"), capsys=capsys)[0] == 0
    code, out, _ = cli("volumes", "list", capsys=capsys)
    volume = Volume.objects.get(name=name)
    assert code == 0 and name in out and volume.public_id in out and "…" not in out
    code, out, _ = cli("volumes", "ls", name, capsys=capsys)
    assert code == 0 and deep.relative_to(tmp_path / "tree").as_posix() in out


def test_billing_shows_the_balance_and_the_ledger(cli, capsys, settings):
    billing.open_billing_account(workspace=cli.workspace, credit_micros=12_500_000)
    billing.record_entry(
        workspace=cli.workspace,
        kind=LedgerEntry.Kind.STORAGE_CHARGE,
        amount_micros=-250_000,
        key="storage",
    )
    code, out, _ = cli("billing", capsys=capsys)
    assert code == 0 and "Balance: 12.25 USD" in out and "adjustment" in out
    assert "jobs 0.00, deployments 0.00, tinker 0.00, storage 0.25" in out
    assert "top-ups are off" in out
    settings.STRIPE_SECRET_KEY = ""
    code, _, err = cli("billing", "top-up", "25", capsys=capsys)
    assert code == 1 and "Payments are disabled" in err
    balance = Client().billing.get()
    assert (balance.balance_usd, balance.low_balance) == ("12.25", False)
    assert balance.spend_usd["storage"] == "0.25"


def test_billing_top_up_prints_the_checkout_page(cli, capsys, stripe_api):
    billing.open_billing_account(workspace=cli.workspace)
    code, out, _ = cli("billing", "top-up", "25", capsys=capsys)
    assert code == 0 and "https://checkout.stripe.test/pay/" in out


def test_transfer_bars_give_their_rate_in_binary_units_as_sizes_are():
    from veri_sdk.cli.output import transfer_progress

    progress = transfer_progress()  # not started: the columns render without a terminal
    task = progress.add_task("corpus", total=8 * 2**20)
    progress.advance(task, 2**20)
    time.sleep(0.2)
    progress.advance(task, 2**20)
    shown = " ".join(str(column.render(progress.tasks[task])) for column in progress.columns[2:4])
    assert re.fullmatch(r"2\.0/8\.0 MiB \d+\.\d (KiB|MiB|GiB)/s", shown), shown


def test_names_print_exactly_with_no_emoji_or_markup(
    cli, capsys, tmp_path, settings, local_store_url
):
    """A name with `:rocket:` or `[bold]…[/]` in it is data: printed as typed, never as 🚀 or
    styling (and an unbalanced `[/]` does not break the command)."""
    settings.VERI_STORE = local_store_url
    (tmp_path / "rows.jsonl").write_text('{"prompt": "hi", "completion": "there"}\n')
    name = "acme:rocket:[bold]x[/] [/]"
    code, out, err = cli(
        "datasets", "upload", str(tmp_path / "rows.jsonl"), "--name", name, capsys=capsys
    )
    assert code == 0 and name in out, err
    code, out, err = cli("datasets", "list", capsys=capsys)
    assert code == 0 and name in out and "🚀" not in out, err
