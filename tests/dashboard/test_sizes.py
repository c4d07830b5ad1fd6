"""Sizes read the same on the dashboard as in the CLI: binary units, `B` for bytes."""

import pytest

from dashboard.templatetags.dashboard import binary_size
from veri_sdk.cli.output import human_bytes


@pytest.mark.parametrize(
    ("n", "written"),
    [
        (0, "0 B"),
        (234, "234 B"),
        (1023, "1023 B"),
        (1024, "1.0 KiB"),
        (552_038, "539.1 KiB"),
        (5 * 1024**2 + 1, "5.0 MiB"),
        (3 * 1024**3, "3.0 GiB"),
        (2 * 1024**4, "2.0 TiB"),
        (2048 * 1024**4, "2048.0 TiB"),
    ],
)
def test_the_dashboard_writes_sizes_as_the_cli_does(n, written):
    assert binary_size(n) == written
    assert human_bytes(n) == written


def test_an_unknown_size_is_a_dash():
    assert binary_size(None) == "—"
