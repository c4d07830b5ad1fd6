"""The first-boot script of a rented machine: fetch the installer, the worker and its wheelhouse
from this control plane, install them into a Python of the worker's version, and run one job with
its job token. One template for every cloud provider."""

import shlex

from django.conf import settings
from django.template import Context, Engine, Library

from providers.base import LaunchSpec

register = Library()
register.filter("shell", shlex.quote)
ENGINE = Engine(
    dirs=[settings.BASE_DIR / "providers" / "templates"], builtins=["providers.bootstrap"]
)
SELF_STOP_MINUTES = 10


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
                "python_mirror": settings.VERI_WORKER_PYTHON_MIRROR,
                "self_stop_minutes": SELF_STOP_MINUTES,
            },
            autoescape=False,  # a shell script: values are quoted with `shell`, not for HTML
        )
    )
