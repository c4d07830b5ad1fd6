"""The first-boot script of a rented machine: install the worker pinned to this control plane's
version and run one job with its job token. One template for every cloud provider."""

import shlex
from importlib.metadata import PackageNotFoundError, version

from django.conf import settings
from django.template import Context, Engine, Library

from providers.base import LaunchSpec

register = Library()
register.filter("shell", shlex.quote)
ENGINE = Engine(
    dirs=[settings.BASE_DIR / "providers" / "templates"], builtins=["providers.bootstrap"]
)
SELF_STOP_MINUTES = 10


def worker_package() -> str:
    """What pip installs on the machine: VERI_WORKER_PACKAGE, else this version of Veri."""
    if settings.VERI_WORKER_PACKAGE:
        return settings.VERI_WORKER_PACKAGE
    try:
        return f"veri[worker]=={version('veri')}"
    except PackageNotFoundError:  # running from a source tree that was never installed
        return "veri[worker]"


def render(spec: LaunchSpec) -> str:
    env = sorted(spec.env.items())
    names = [name for name, _ in env]
    assert all(name.isidentifier() for name in names), names  # our own names, never customers'
    return ENGINE.get_template("providers/bootstrap.sh").render(
        Context(
            {
                "job_id": spec.job_id,
                "api_url": spec.api_url,
                "env": env,
                "package": worker_package(),
                "index_url": settings.VERI_WORKER_INDEX_URL,
                "self_stop_minutes": SELF_STOP_MINUTES,
            },
            autoescape=False,  # a shell script: values are quoted with `shell`, not for HTML
        )
    )
