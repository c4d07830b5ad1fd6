"""`veri login` and `veri volumes …`."""

import getpass
import threading
from pathlib import Path

from rich.markup import escape as markup_escape

from veri_sdk.cli.output import (
    err,
    human_bytes,
    out,
    print_json,
    print_table,
    table,
    transfer_progress,
)
from veri_sdk.config import DEFAULT_API_URL, load_config, save_config


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
    if args.json:
        print_json([v.__dict__ for v in client.volumes.list()])
        return 0
    listing = table("NAME", "ID", "REGION", "FILES", "SIZE", "CREATED", whole=("NAME", "ID"))
    for v in client.volumes.list():
        listing.add_row(
            v.name, v.id, v.region, str(v.file_count), human_bytes(v.total_bytes), v.created_at
        )
    print_table(listing)
    return 0


def cmd_volumes_ls(args, client) -> int:
    listing = table("PATH", "SIZE", "SHA256", "UPLOADED", whole=("PATH",))
    files = client.volumes.files(args.name, prefix=args.prefix or "")
    if args.json:
        print_json([f.__dict__ for f in files])
        return 0
    for f in files:
        listing.add_row(f.path, human_bytes(f.size), f.sha256[:12], f.uploaded_at)
    print_table(listing)
    out.print(f"{len(files)} file(s), {human_bytes(sum(f.size for f in files))}")
    return 0


def cmd_volumes_upload(args, client) -> int:
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
    if not Path(args.dir).is_dir():
        err.print(f"error: {args.dir} is not a folder")
        return 2
    lock, total = threading.Lock(), [0]
    progress = transfer_progress()
    task = progress.add_task(Path(args.dir).name or args.dir, total=None)

    def grow(n: int) -> None:
        with lock:
            if n and not total[0]:
                progress.start()  # drawn once there is something to send, never empty
            total[0] += n
            progress.update(task, total=total[0])

    try:
        result = client.volumes.upload_dir(
            args.name,
            args.dir,
            prefix=args.prefix or "",
            on_bytes=lambda n: progress.advance(task, n),
            on_total=grow,
        )
    finally:
        if total[0]:  # started; stopping one never started would still print a blank line
            progress.stop()
    if not result.uploaded and not result.skipped:
        out.print(f"Nothing to upload: {args.dir} holds no files.")
    elif not result.uploaded:
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
            f"Volume [bold]{markup_escape(volume.name)}[/] holds {volume.file_count} file(s), "
            f"{human_bytes(volume.total_bytes)}. This deletes them all.",
            markup=True,
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
