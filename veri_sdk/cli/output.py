"""What every `veri` command prints with: rich consoles, tables that never cut ids, sizes, JSON."""

import json
import sys

from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    ProgressColumn,
    TextColumn,
    TimeRemainingColumn,
)
from rich.table import Column, Table
from rich.text import Text

# Piped or redirected, tables and messages are printed whole (nothing wrapped or cut). What is
# printed is mostly user data (model names like `ft:…:rocket:…`, dataset names, API messages): no
# emoji codes and no markup by default, so it prints exactly; the CLI's own styling passes
# `markup=True` and escapes what it interpolates (rich.markup.escape).
out = Console(width=None if sys.stdout.isatty() else 10_000, markup=False, emoji=False)
err = Console(stderr=True, width=None if sys.stderr.isatty() else 10_000, markup=False, emoji=False)


class _Table(Table):
    """Keeps each `whole` column at least as wide as its longest value: on a narrow terminal the
    other columns wrap, and when the whole columns alone are wider than the terminal the table is
    printed wider (the terminal wraps the line) rather than an id being cut or split."""

    def add_row(self, *values, **kwargs) -> None:
        super().add_row(*values, **kwargs)
        for column, value in zip(self.columns, values, strict=False):
            if column.no_wrap and isinstance(value, str):
                longest = max((len(line) for line in value.splitlines()), default=0)
                column.min_width = max(column.min_width or 0, longest)

    def __rich_console__(self, console, options):
        padding = 2  # box=None: one space each side of a column
        needed = sum((c.min_width or 0) + padding for c in self.columns if c.no_wrap)
        needed += sum(len(c.header) + padding for c in self.columns if not c.no_wrap)
        if needed > options.max_width:
            options = options.update_width(needed)
        yield from super().__rich_console__(console, options)


def table(*columns: str, whole: tuple[str, ...] = (), header: bool = True) -> Table:
    """A plain table whose `whole` columns (ids, paths) are printed whole; other columns wrap.
    `header=False`: a name/value listing, whose column names go unprinted."""
    return _Table(
        *(
            Column(name, no_wrap=True) if name in whole else Column(name, overflow="fold")
            for name in columns
        ),
        box=None,
        show_header=header,
    )


def print_table(listing: Table) -> None:
    out.print(listing, crop=False)  # a line wider than the terminal is the terminal's to wrap


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


class BinaryTransferSpeed(ProgressColumn):
    """The transfer rate in the units every size is shown in (rich's own speed column is
    decimal: `6.3 MB/s` beside `5.9 KiB`)."""

    def render(self, task) -> Text:
        speed = task.finished_speed or task.speed
        shown = "?" if speed is None else f"{human_bytes(int(speed))}/s"
        return Text(shown, style="progress.data.speed")


def transfer_progress() -> Progress:
    return Progress(
        TextColumn("{task.description}", style="bold", markup=False),  # a file name
        BarColumn(),
        DownloadColumn(binary_units=True),
        BinaryTransferSpeed(),
        TimeRemainingColumn(),
        console=err,
        transient=False,
    )
