"""Who may import whom (ARCHITECTURE.md): the import-linter contracts in pyproject.toml hold.
The apps are floors with every import pointing down (training never imports billing, providers
never imports training, webhooks imports only veri so that any app can publish events), and
worker/ and veri_sdk/ import neither Django nor an app."""

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_every_import_points_down_a_floor():
    lint_imports = Path(sys.executable).parent / "lint-imports"
    result = subprocess.run(
        [str(lint_imports), "--no-cache"], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr
