"""Bytecode for what the worker runs, written by `make install`: the modules of the worker extra's
packages and of everything they depend on, and the worker package itself.

A sandboxed training process (worker/sandbox.py) cannot write `__pycache__`, so what it imports
must be compiled before it runs, or every training process compiles it again. Every other
process writes its own on first import. Compiling all of site-packages instead (`uv pip install
--compile-bytecode`) took 45 of the install's 55 CPU-s on 2 cores, most of it for modules
nothing imports (the test tools', the control plane's clients'). What the libraries import only
when it is there (PIL, h2: a few dozen small modules) is left out, and compiled in each training
process."""

import compileall
import functools
import sys
from concurrent.futures import ProcessPoolExecutor
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parent.parent


def closure(requirements: list[Requirement]) -> list:
    """The installed distributions `requirements` name and all they need, extras followed."""
    found, seen, todo = {}, set(), list(requirements)
    while todo:
        wanted = todo.pop()
        name, extras = canonicalize_name(wanted.name), frozenset(wanted.extras)
        if (name, extras) in seen:
            continue
        seen.add((name, extras))
        try:
            found[name] = distribution(name)
        except PackageNotFoundError:  # a dependency for another platform or Python
            continue
        environments = [{"extra": extra} for extra in extras] or [{"extra": ""}]
        for line in found[name].requires or []:
            needed = Requirement(line)
            if needed.marker is None or any(needed.marker.evaluate(e) for e in environments):
                todo.append(needed)
    return list(found.values())


def worker_requirements() -> list[Requirement]:
    """The worker extra's own requirements (not the control plane's, which Veri always needs)."""
    listed = [Requirement(line) for line in distribution("veri").requires or []]
    return [r for r in listed if r.marker and r.marker.evaluate({"extra": "worker"})]


def sources() -> list[str]:
    files = {
        str(dist.locate_file(path))
        for dist in closure(worker_requirements())
        for path in dist.files or []
        if path.suffix == ".py" and ".." not in path.parts
    }
    # site-packages' own modules (the editable install's finder, which every process imports)
    site_packages = Path(distribution("veri").locate_file(""))
    loose = [*site_packages.glob("*.py"), *(REPO / "worker").glob("*.py")]
    return sorted(files | {str(path) for path in loose})


def main() -> int:
    paths = sources()
    # Quietly: a file that does not compile (a template, a test of a syntax error) is never
    # imported, as under `--compile-bytecode`.
    compile_file = functools.partial(compileall.compile_file, quiet=2)
    with ProcessPoolExecutor() as pool:
        failed = len(paths) - sum(map(bool, pool.map(compile_file, paths, chunksize=64)))
    print(f"compiled {len(paths) - failed} modules the worker may run ({failed} left)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
