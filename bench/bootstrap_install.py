"""How long a rented machine takes to install the worker: the bootstrap's way (uv, a Python it
finds, the control plane's wheelhouse) against pip's (`python3 -m venv` and `pip install`), both
installing the same worker wheel (this code, as the control plane serves it) into a new
environment, timed the same way: wall time from an empty folder to an environment that imports
`worker` and `trl`, each run with an empty cache, as on a new machine.

    .venv/bin/python -m bench.bootstrap_install [--repeat 3]

Sides, taking turns: `pip/index` (the old bootstrap: pip from the package index, here PyPI and
this machine's mirrors), `pip/wheelhouse` (pip from the same wheelhouse: the installer alone),
`uv/wheelhouse` (the bootstrap). Prints each time, the medians and the ratios (pip / uv: above 1
means the bootstrap is faster). The wheelhouse's download (the bootstrap's fetch step, parallel
GETs from the store in the machines' region) is not in these times; it is in the job's
`bootstrap.fetch_seconds`.
"""

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import django

from bench.common import timed

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
django.setup()

from providers import worker_dist  # noqa: E402 - needs the settings set up above

PYTHON = "/usr/bin/python3.11"  # the image's Python, as a bootstrap would find it
UV = shutil.which("uv", path=str(Path(sys.executable).parent))


def run(command: list, env: dict) -> None:
    subprocess.run(command, check=True, env=env, stdout=subprocess.DEVNULL)


def install(side: str, folder: Path, wheel: Path, wheelhouse: Path) -> float:
    venv, cache = folder / "venv", folder / "cache"
    env = {"PATH": "/usr/bin:/bin", "HOME": str(folder), "PIP_CACHE_DIR": str(cache)}
    env |= {k: v for k, v in os.environ.items() if k.startswith("PIP_") and k != "PIP_CACHE_DIR"}
    source = ["--no-index", "--find-links", str(wheelhouse)] if side.endswith("wheelhouse") else []
    if side.startswith("pip"):
        steps = [
            [PYTHON, "-m", "venv", str(venv)],
            [venv / "bin/pip", "install", "--quiet", *source, str(wheel)],
        ]
    else:
        env |= {"UV_CACHE_DIR": str(cache), "UV_NO_CONFIG": "1"}
        steps = [
            [UV, "venv", "--quiet", "--python", "3.11", str(venv)],
            [UV, "pip", "install", "--quiet", "--python", venv / "bin/python", *source, str(wheel)],
        ]
    took = timed(lambda: [run(step, env) for step in steps])
    run([venv / "bin/python", "-c", "import worker.runner, trl, torch"], {"PATH": "/usr/bin"})
    return took


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir="/tmp") as scratch:
        scratch = Path(scratch)
        name, data = worker_dist.worker_wheel_bytes()
        wheel = scratch / name
        wheel.write_bytes(data)
        wheelhouse = scratch / "wheelhouse"
        command = worker_dist.pip_download_command(
            python="3.11", backend="cpu", torch_index_url=None
        )
        subprocess.run(
            [*command, "--dest", wheelhouse, *worker_dist.worker_requirements()], check=True
        )
        size = sum(f.stat().st_size for f in wheelhouse.iterdir()) / 2**20
        print(f"worker set: {len(list(wheelhouse.iterdir()))} wheels, {size:.0f} MiB (torch CPU)")
        times: dict[str, list[float]] = {"pip/index": [], "pip/wheelhouse": [], "uv/wheelhouse": []}
        for round_ in range(args.repeat):
            for side, found in times.items():
                folder = scratch / f"{side.replace('/', '-')}-{round_}"
                folder.mkdir()
                found.append(install(side, folder, wheel, wheelhouse))
                shutil.rmtree(folder)
                print(f"round {round_ + 1} {side}: {found[-1]:.1f} s", flush=True)
    medians = {side: statistics.median(found) for side, found in times.items()}
    for side, found in times.items():
        spread = f"{min(found):.1f}–{max(found):.1f}"
        print(f"{side:15} median {medians[side]:6.1f} s  ({spread} s over {args.repeat})")
    uv = medians["uv/wheelhouse"]
    print(f"pip/index / uv/wheelhouse: {medians['pip/index'] / uv:.1f}x")
    print(f"pip/wheelhouse / uv/wheelhouse: {medians['pip/wheelhouse'] / uv:.1f}x")


if __name__ == "__main__":
    main()
