"""Where the SDK finds its API URL and key: arguments, the environment, then `veri login`'s file."""

import json
import os
from pathlib import Path

DEFAULT_API_URL = "http://127.0.0.1:8000"


def config_path() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "veri" / "config.json"


def load_config() -> dict:
    try:
        return json.loads(config_path().read_text())
    except (FileNotFoundError, ValueError):
        return {}


def save_config(*, api_url: str, api_key: str) -> Path:
    path = config_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch(mode=0o600, exist_ok=True)
    path.write_text(json.dumps({"api_url": api_url, "api_key": api_key}, indent=2))
    return path


def resolve(api_key: str | None, base_url: str | None) -> tuple[str | None, str]:
    saved = load_config()
    key = api_key or os.environ.get("VERI_API_KEY") or saved.get("api_key")
    url = base_url or os.environ.get("VERI_API_URL") or saved.get("api_url") or DEFAULT_API_URL
    return key, url.rstrip("/")
