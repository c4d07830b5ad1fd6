"""The docs site builds with `mkdocs build --strict`: a broken link, a page left out of the
navigation or a schema drawn wrong fails here, so `make test` (what CI runs) keeps the site
whole."""

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_docs_site_builds_strict(tmp_path):
    mkdocs = Path(sys.executable).with_name("mkdocs")
    result = subprocess.run(
        [str(mkdocs), "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=REPO,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    schema_page = (tmp_path / "site" / "api-schema.html").read_text()
    assert "POST /v1/training_jobs" in schema_page  # rendered from the code's schema
    assert (tmp_path / "site" / "openapi.json").exists()
    assert 'class="mermaid"' in (tmp_path / "site" / "architecture.html").read_text()


def test_the_readme_stays_the_short_front_door():
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= 150
    for page in ("docs/architecture.md", "docs/api.md", "docs/deploy.md", "CONTRIBUTING.md"):
        assert page in readme and (REPO / page).exists(), page
