"""The base models a Tinker session can train: a model folder in one of the workspace's volumes
(`volume://VOLUME/PATH`, as jobs take it), or a hub id the provider's workers can load."""

from django.conf import settings

from providers.services import get_adapter
from veri.errors import VeriError
from veri.models import Workspace
from volumes import selectors as volume_selectors
from volumes.stores import store_for


def _volume_files(workspace: Workspace, base_model: str) -> list[dict]:
    name, _, path = base_model.removeprefix("volume://").partition("/")
    volume = volume_selectors.get_volume(workspace=workspace, id_or_name=name)
    folder = path.strip("/") + "/"
    files = list(volume_selectors.list_files(volume=volume, prefix=folder))
    if not any(f.path == f"{folder}config.json" for f in files):
        raise VeriError(
            f"base_model {base_model!r}: volume {name!r} has no model folder {path!r} (no "
            "config.json there).",
            field="base_model",
        )
    store, ttl = store_for(volume.store_prefix), settings.VERI_PRESIGN_TTL_SECONDS
    return [
        {"path": f.path.removeprefix(folder), "size": f.size}
        | store.signed_get(f.object_key, expires=ttl, byte_range=f.byte_range)
        for f in files
    ]


def check_base_model(*, workspace: Workspace, base_model: str) -> None:
    if base_model.startswith("volume://"):
        _volume_files(workspace, base_model)
        return
    problem = get_adapter(settings.VERI_TINKER_PROVIDER).model_problem(base_model)
    if problem:
        raise VeriError(problem, field="base_model")


def base_model_spec(*, workspace: Workspace, base_model: str) -> dict:
    """What the worker loads: `{name}` for a hub id, `{name, files: [{path, size, url}]}` for a
    volume's folder (presigned URLs)."""
    if base_model.startswith("volume://"):
        return {"name": base_model, "files": _volume_files(workspace, base_model)}
    return {"name": base_model}


def supported_models(*, workspace: Workspace) -> list[str]:
    """What `get_server_capabilities` lists: the workspace's volume model folders."""
    found = []
    for volume in volume_selectors.list_volumes(workspace=workspace):
        # A model folder holds `config.json` itself (not only `tokenizer_config.json`).
        configs = volume_selectors.list_files(volume=volume).filter(path__endswith="/config.json")
        for path in configs.order_by("path").values_list("path", flat=True):
            found.append(f"volume://{volume.name}/{path.removesuffix('/config.json')}")
    return found
