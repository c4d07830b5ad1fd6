"""The `veri` command. Exit codes: 0 success, 1 the request failed (message on stderr), 2 usage."""

import argparse
import getpass
import sys
import threading

from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)
from rich.table import Column, Table

from veri_sdk.client import Client
from veri_sdk.config import DEFAULT_API_URL, load_config, save_config
from veri_sdk.errors import AuthenticationError, VeriAPIError
from veri_sdk.http import LOGIN_HINT

# Piped or redirected, tables are printed whole (nothing wrapped or cut) for scripts to read.
out = Console(width=None if sys.stdout.isatty() else 10_000)
err = Console(stderr=True)


def table(*columns: str, whole: tuple[str, ...] = ()) -> Table:
    """A plain table; the `whole` columns (ids, paths) are never cut short with an ellipsis: on a
    narrow terminal they wrap instead."""
    return Table(
        *(Column(name, overflow="fold") if name in whole else Column(name) for name in columns),
        box=None,
    )


def human_bytes(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def transfer_progress() -> Progress:
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        DownloadColumn(binary_units=True),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        console=err,
        transient=False,
    )


def cmd_login(args, client_factory) -> int:
    saved = load_config()
    api_url = (
        args.api_url
        or input(f"API URL [{saved.get('api_url', DEFAULT_API_URL)}]: ").strip()
        or saved.get("api_url", DEFAULT_API_URL)
    )
    api_key = args.api_key or getpass.getpass("API key: ").strip()
    client_factory(api_key=api_key, base_url=api_url).volumes.list()  # 401 here if the key is wrong
    path = save_config(api_url=api_url.rstrip("/"), api_key=api_key)
    out.print(f"Logged in to {api_url}; saved to {path}")
    return 0


def cmd_volumes_create(args, client) -> int:
    volume = client.volumes.create(args.name, region=args.region)
    out.print(f"{volume.name}  {volume.id}  {volume.region}")
    return 0


def cmd_volumes_list(args, client) -> int:
    listing = table("NAME", "ID", "REGION", "FILES", "SIZE", "CREATED", whole=("NAME", "ID"))
    for v in client.volumes.list():
        listing.add_row(
            v.name, v.id, v.region, str(v.file_count), human_bytes(v.total_bytes), v.created_at
        )
    out.print(listing)
    return 0


def cmd_volumes_ls(args, client) -> int:
    listing = table("PATH", "SIZE", "SHA256", "UPLOADED", whole=("PATH",))
    files = client.volumes.files(args.name, prefix=args.prefix or "")
    for f in files:
        listing.add_row(f.path, human_bytes(f.size), f.sha256[:12], f.uploaded_at)
    out.print(listing)
    out.print(f"{len(files)} file(s), {human_bytes(sum(f.size for f in files))}")
    return 0


def cmd_volumes_upload(args, client) -> int:
    from pathlib import Path

    local = Path(args.file)
    if not local.is_file():
        err.print(f"error: {local} is not a file")
        return 2
    with transfer_progress() as progress:
        task = progress.add_task(local.name, total=local.stat().st_size)
        file = client.volumes.upload_file(
            args.name, local, path=args.path, on_bytes=lambda n: progress.advance(task, n)
        )
    if file is None:
        out.print(
            f"{args.path or local.name} is already in {args.name} (same size and sha256); "
            "nothing uploaded."
        )
    else:
        out.print(f"Uploaded {file.path} ({human_bytes(file.size)}) to {args.name}.")
    return 0


def cmd_volumes_upload_dir(args, client) -> int:
    from pathlib import Path

    if not Path(args.dir).is_dir():
        err.print(f"error: {args.dir} is not a folder")
        return 2
    lock, total = threading.Lock(), [0]
    with transfer_progress() as progress:
        task = progress.add_task(Path(args.dir).name or args.dir, total=None)

        def grow(n: int) -> None:
            with lock:
                total[0] += n
                progress.update(task, total=total[0])

        result = client.volumes.upload_dir(
            args.name,
            args.dir,
            prefix=args.prefix or "",
            on_bytes=lambda n: progress.advance(task, n),
            on_total=grow,
        )
    if not result.uploaded:
        out.print(
            f"Nothing to upload: all {len(result.skipped)} file(s) are already in {args.name}."
        )
    else:
        out.print(
            f"Uploaded {len(result.uploaded)} file(s) ({human_bytes(result.bytes_uploaded)}) to "
            f"{args.name}; skipped {len(result.skipped)} already there."
        )
    return 0


def cmd_volumes_delete(args, client) -> int:
    volume = client.volumes.get(args.name)
    if not args.yes:
        err.print(
            f"Volume [bold]{volume.name}[/] holds {volume.file_count} file(s), "
            f"{human_bytes(volume.total_bytes)}. This deletes them all."
        )
        try:
            typed = input("Type the volume name to confirm: ").strip()
        except EOFError:
            typed = ""
        if typed != volume.name:
            err.print("Not deleted: the name did not match.")
            return 1
    client.volumes.delete(volume.id, confirm=volume.name)
    out.print(
        f"Deleted volume {volume.name} ({volume.file_count} files, "
        f"{human_bytes(volume.total_bytes)})."
    )
    return 0


def cmd_billing(args, client) -> int:
    balance = client.billing.get()
    low = "  (low: below a day of recent spend)" if balance.low_balance else ""
    out.print(f"Balance: {balance.balance_usd} USD{low}")
    if not balance.payments_enabled:
        out.print("Card top-ups are off on this deployment; an operator adds credit.")
    listing = table(
        "WHEN", "KIND", "AMOUNT (USD)", "JOB / VOLUME", "DESCRIPTION", whole=("JOB / VOLUME",)
    )
    for entry in client.billing.ledger(limit=args.limit):
        listing.add_row(
            entry["created_at"],
            entry["kind"],
            entry["amount_usd"],
            entry["job_id"] or entry["volume_id"] or "",
            entry["description"],
        )
    out.print(listing)
    return 0


def cmd_billing_top_up(args, client) -> int:
    url = client.billing.top_up(args.amount)
    out.print(f"Pay {args.amount} USD here; the balance grows once the payment goes through:")
    out.print(url, soft_wrap=True)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="veri", description="Veri: managed LLM training.")
    parser.add_argument("--api-url", help="default: VERI_API_URL, else `veri login`'s")
    parser.add_argument("--api-key", help="default: VERI_API_KEY, else `veri login`'s")
    commands = parser.add_subparsers(dest="command", required=True)

    login = commands.add_parser("login", help="save the API URL and key to ~/.config/veri")
    # SUPPRESS: the subcommand must not reset what was given before it (`veri --api-url U login`).
    login.add_argument("--api-url", default=argparse.SUPPRESS, help="e.g. http://127.0.0.1:8000")
    login.add_argument("--api-key", default=argparse.SUPPRESS, help="asked for when not given")
    login.set_defaults(run=cmd_login, needs_client=False)

    volumes = commands.add_parser("volumes", help="named storage mounted into training jobs")
    vc = volumes.add_subparsers(dest="volumes_command", required=True)
    create = vc.add_parser("create", help="create a volume (same name: returns the existing one)")
    create.add_argument("name")
    create.add_argument("--region")
    create.set_defaults(run=cmd_volumes_create)
    upload = vc.add_parser("upload", help="upload one file, with a progress bar")
    upload.add_argument("name")
    upload.add_argument("file")
    upload.add_argument("--path", help="path inside the volume (default: the file's name)")
    upload.set_defaults(run=cmd_volumes_upload)
    upload_dir = vc.add_parser(
        "upload-dir", help="upload a folder, 8 files at a time, skipping files already there"
    )
    upload_dir.add_argument("name")
    upload_dir.add_argument("dir")
    upload_dir.add_argument("--prefix", help="folder inside the volume to upload into")
    upload_dir.set_defaults(run=cmd_volumes_upload_dir)
    vc.add_parser("list", help="list volumes").set_defaults(run=cmd_volumes_list)
    ls = vc.add_parser("ls", help="list a volume's files")
    ls.add_argument("name")
    ls.add_argument("--prefix")
    ls.set_defaults(run=cmd_volumes_ls)
    delete = vc.add_parser("delete", help="delete a volume and its files")
    delete.add_argument("name")
    delete.add_argument("--yes", action="store_true", help="do not ask for the name")
    delete.set_defaults(run=cmd_volumes_delete)

    billing = commands.add_parser("billing", help="the balance and recent charges and credits")
    billing.add_argument("--limit", type=int, default=20, help="entries to show (default 20)")
    billing.set_defaults(run=cmd_billing)
    bc = billing.add_subparsers(dest="billing_command")
    top_up = bc.add_parser("top-up", help="a card payment page that adds AMOUNT USD")
    top_up.add_argument("amount", help="in USD, e.g. 25")
    top_up.set_defaults(run=cmd_billing_top_up)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)  # usage errors exit 2 here
    try:
        if getattr(args, "needs_client", True):
            return args.run(args, Client(api_key=args.api_key, base_url=args.api_url))
        return args.run(args, Client)
    except VeriAPIError as exc:
        err.print(f"error: {exc.message}", highlight=False, markup=False)
        if isinstance(exc, AuthenticationError) and exc.code != "missing_api_key":
            err.print(f"To use another key, {LOGIN_HINT}.", highlight=False, markup=False)
        return 1
    except KeyboardInterrupt:
        err.print("interrupted")
        return 1


if __name__ == "__main__":
    sys.exit(main())
