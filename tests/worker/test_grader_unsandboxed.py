"""A control plane not run as root cannot sandbox a python grader: its code would run as the
control plane's own user, able to read the API process's environment. It is refused there, unless
a development machine opts in."""

import os

import pytest

from worker import graders

READS_PARENT = """
import os

def grade(sample, item):
    environ = open(f"/proc/{os.getppid()}/environ", "rb").read()
    return 1.0 if b"canary-value" in environ else 0.0
"""
PYTHON = {"type": "python", "name": "leak", "source": READS_PARENT}
CHECK = {"type": "string_check", "name": "s", "input": "x", "reference": "x", "operation": "eq"}


@pytest.fixture
def not_root(monkeypatch):
    """This process as a control plane run by its own user (the deployment's `User=veri`)."""
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setenv("VERI_CANARY", "canary-value")
    monkeypatch.delenv("VERI_GRADERS_UNSANDBOXED", raising=False)


def test_a_python_grader_is_refused_where_it_cannot_be_sandboxed(not_root):
    multi = {"type": "multi", "name": "m", "graders": {"p": PYTHON}, "calculate_output": "p"}
    for grader in (PYTHON, multi):
        result = graders.run_isolated(grader, sample=graders.sample_for("x"), item={})
        assert result["reward"] == 0.0
        assert result["errors"]["python_grader_server_error"] is True
        assert result["errors"]["python_grader_server_error_type"] == "sandbox_unavailable"
    # Graders without code run no customer code: they are scored as ever.
    assert graders.run_isolated(CHECK, sample=graders.sample_for("x"), item={})["reward"] == 1.0


def test_a_development_machine_opts_in(not_root, monkeypatch):
    monkeypatch.setenv("VERI_GRADERS_UNSANDBOXED", "1")
    result = graders.run_isolated(PYTHON, sample=graders.sample_for("x"), item={})
    assert result["errors"]["python_grader_server_error"] is False
