import pytest

from veri import services as veri_services
from veri_sdk.cli import main


@pytest.fixture
def cli(live_server, monkeypatch, tmp_path):
    """Runs `veri ...` in-process against the live server; returns (exit code, stdout, stderr)."""
    workspace, key = veri_services.create_workspace(name="cli")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("VERI_API_URL", live_server.url)
    monkeypatch.setenv("VERI_API_KEY", key)

    def run(*args: str, capsys) -> tuple[int, str, str]:
        capsys.readouterr()
        code = main(list(args))
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    run.workspace, run.key, run.url = workspace, key, live_server.url
    return run
