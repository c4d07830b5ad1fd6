"""The first-boot script of a rented machine: fetch the installer, the worker and its wheelhouse
from this control plane, install them into a Python of the worker's version, and run one job with
its job token, one replica of a deployment with its replica token, or one Tinker training
client's model with its model token (for those two on a GPU machine also installing the serving
engine, vLLM). One template for every cloud provider."""

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
# Whose worker a machine runs (LaunchSpec.kind: its routes, /v1/worker/{kind}/{id}/…) and the
# variable of spec.env that holds its token, the one secret the bootstrap itself uses.
TOKENS = {
    "jobs": "VERI_JOB_TOKEN",
    "replicas": "VERI_REPLICA_TOKEN",
    "tinker_models": "VERI_TINKER_TOKEN",
}


def render(spec: LaunchSpec) -> str:
    env = sorted(spec.env.items())
    names = [name for name, _ in env]
    assert all(name.isidentifier() for name in names), names  # our own names, never customers'
    assert TOKENS.get(spec.kind) in spec.env, spec.kind
    return ENGINE.get_template("providers/bootstrap.sh").render(
        Context(
            {
                "job_id": spec.route_id or spec.job_id,
                "kind": spec.kind,
                "token_name": TOKENS[spec.kind],
                "worker_command": spec.worker_command(),
                "engine_requirement": spec.engine_requirement,
                "api_url": spec.api_url,
                "env": env,
                "python_mirror": settings.VERI_WORKER_PYTHON_MIRROR,
                "self_stop_minutes": SELF_STOP_MINUTES,
            },
            autoescape=False,  # a shell script: values are quoted with `shell`, not for HTML
        )
    )
