"""The demo's closing `Next:` lines (the demo itself trains for minutes: tests/e2e covers
training; this checks what it tells the user to run next)."""

import shlex

from config.management.commands.quickstart import next_steps
from veri_sdk.cli import build_parser


def test_next_names_the_trained_job_to_deploy_and_every_veri_line_is_a_command():
    text = next_steps(api_key="veri_sk_x", job_id="job_abc123")
    assert ".venv/bin/veri deploy job_abc123" in text
    assert ".venv/bin/veri jobs get job_abc123" in text
    commands = [
        shlex.split(line.split("#")[0])[1:]
        for line in text.splitlines()
        if line.strip().startswith(".venv/bin/veri ")
    ]
    assert ["deploy", "job_abc123"] in commands
    for argv in commands:
        build_parser().parse_args(argv)  # exits 2 for anything the CLI does not take
