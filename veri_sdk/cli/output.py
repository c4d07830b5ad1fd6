"""What every `veri` command prints with: rich consoles, tables that never cut ids, sizes, JSON."""

import json
import sys

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

# Piped or redirected, tables and messages are printed whole (nothing wrapped or cut).
out = Console(width=None if sys.stdout.isatty() else 10_000)
err = Console(stderr=True, width=None if sys.stderr.isatty() else 10_000)


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


def print_json(value) -> None:
    """`--json`: the API's own objects, for scripts (`jq`)."""
    sys.stdout.write(json.dumps(value, indent=2, default=str) + "\n")


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
