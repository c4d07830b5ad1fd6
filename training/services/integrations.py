"""A job's integrations: services it reports to on the workspace's behalf (Weights & Biases),
checked at submit and handed to the runner, with the secrets they need, in the worker's spec."""

from django.conf import settings

from veri import selectors as veri_selectors
from veri.errors import VeriError
from veri.models import Workspace

WANDB_KEY = "WANDB_API_KEY"
MAX_TAGS, MAX_TAG_CHARS, MAX_NAME_CHARS = 50, 64, 128


def _optional_string(given: dict, name: str, field: str) -> str | None:
    value = given.get(name)
    if value is not None and (not isinstance(value, str) or not 1 <= len(value) <= MAX_NAME_CHARS):
        raise VeriError(
            f"{field} must be a string of 1 to {MAX_NAME_CHARS} characters.", field=field
        )
    return value


def _wandb(given: object, at: str) -> dict:
    if not isinstance(given, dict):
        raise VeriError(f'{at} must be an object such as {{"project": "my-project"}}.', field=at)
    if unknown := set(given) - {"project", "name", "entity", "tags"}:
        raise VeriError(
            f"{at} takes project, name, entity and tags; not {', '.join(sorted(unknown))}.",
            field=f"{at}.{sorted(unknown)[0]}",
        )
    if given.get("project") is None:
        raise VeriError(
            f"{at}.project is required: the W&B project to log to.", field=f"{at}.project"
        )
    tags = given.get("tags") or []
    if not isinstance(tags, list) or len(tags) > MAX_TAGS:
        raise VeriError(
            f"{at}.tags must be a list of at most {MAX_TAGS} strings.", field=f"{at}.tags"
        )
    for tag in tags:
        if not isinstance(tag, str) or not 1 <= len(tag) <= MAX_TAG_CHARS:
            raise VeriError(
                f"Each of {at}.tags is a string of 1 to {MAX_TAG_CHARS} characters.",
                field=f"{at}.tags",
            )
    return {
        "project": _optional_string(given, "project", f"{at}.project"),
        "name": _optional_string(given, "name", f"{at}.name"),
        "entity": _optional_string(given, "entity", f"{at}.entity"),
        "tags": tags,
    }


def validate_integrations(given: object, *, workspace: Workspace) -> list[dict]:
    """`[{"type": "wandb", "wandb": {project, name?, entity?, tags?}}]`, checked; a W&B one
    needs the workspace's WANDB_API_KEY secret unless this deployment logs W&B offline."""
    if given is None:
        return []
    if not isinstance(given, list) or len(given) > 1:
        raise VeriError(
            'integrations is a list of at most one {"type": "wandb", "wandb": {...}}.',
            field="integrations",
        )
    checked = []
    for index, item in enumerate(given):
        at = f"integrations[{index}]"
        kind = item.get("type") if isinstance(item, dict) else None
        if kind != "wandb":
            raise VeriError(
                f'{at}.type must be "wandb", the one integration Veri runs; got {kind!r}.',
                field=f"{at}.type",
            )
        checked.append({"type": "wandb", "wandb": _wandb(item.get("wandb"), f"{at}.wandb")})
    if (
        checked
        and settings.VERI_WANDB_MODE != "offline"
        and not veri_selectors.has_secret(workspace=workspace, name=WANDB_KEY)
    ):
        raise VeriError(
            f"A W&B integration logs with the workspace's {WANDB_KEY} secret, which is not set: "
            f"run `veri secrets set {WANDB_KEY}` (or PUT /v1/secrets/{WANDB_KEY}) first.",
            field="integrations",
            code="missing_secret",
        )
    return checked


def runner_secrets(*, workspace: Workspace, integrations: list[dict]) -> dict:
    """The secrets the job's integrations need, opened for the runner (never for the training
    process: the runner keeps them out of the job file and the training's environment)."""
    if not any(i["type"] == "wandb" for i in integrations):
        return {}
    try:
        key = veri_selectors.secret_value(workspace=workspace, name=WANDB_KEY)
    except ValueError:  # sealed under another SECRET_KEY: the job trains, W&B says it has no key
        return {}
    return {WANDB_KEY: key} if key else {}
