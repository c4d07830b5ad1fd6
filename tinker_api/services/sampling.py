"""Sampling: `save_weights_for_sampler` keeps the model's LoRA weights as they are at that point of
its order (in its worker's memory), and a sampler is those weights: its id is
`<model_id>:sample:<seq_id>` of that save, a named save is also addressed as
`tinker://<model_id>/sampler_weights/<name>`. Samples run on the model's worker, between its
other operations, with the saved weights. Samplers live as long as their model.

A base model's sampler (no weights) is a model of its own, never trained: a rank-1 LoRA whose
second matrix starts at zero (PEFT's initialisation), so it computes exactly the base model."""

import re

from tinker_api.models import OpKind, OpStatus, TinkerModel, TinkerOperation, TinkerSession
from tinker_api.services import sessions
from tinker_api.services.checkpoints import NAME_RE
from veri.errors import NotFound, VeriError
from veri.models import Workspace

SAMPLER_RE = re.compile(r"^(?P<model>.+):sample:(?P<seq>[0-9]{1,9})$")
MAX_SAMPLES = 64
MAX_TOKENS = 4096
# A base model's sampler's model_seq_id: past those a client may give its training clients.
BASE_SAMPLER_SEQ = 10_001
BASE_LORA = {"rank": 1, "train_unembed": False, "train_mlp": False, "train_attn": True}


def sampler_id(operation: TinkerOperation) -> str:
    return f"{operation.model.model_id}:sample:{operation.seq_id}"


def sampler_path(operation: TinkerOperation) -> str:
    return f"tinker://{operation.model.model_id}/sampler_weights/{operation.payload['name']}"


def save_for_sampler(*, model: TinkerModel, seq_id: int, name: str | None) -> TinkerOperation:
    if name is not None and not NAME_RE.fullmatch(name):
        raise VeriError(
            "A sampler's name is letters, digits, '.', '_' and '-' (up to 100).", field="path"
        )
    payload = {"name": name} if name else {}
    return sessions.enqueue(
        model=model, seq_id=seq_id, kind=OpKind.SAVE_FOR_SAMPLER, payload=payload
    )


def saved_answer(operation: TinkerOperation) -> dict:
    """What the client reads of a finished save: the path it named, else a sampler's id."""
    if operation.payload.get("name"):
        return {"type": "save_weights_for_sampler", "path": sampler_path(operation)}
    return {"type": "save_weights_for_sampler", "sampling_session_id": sampler_id(operation)}


def _saves(workspace: Workspace):
    return TinkerOperation.objects.filter(
        model__workspace=workspace, kind=OpKind.SAVE_FOR_SAMPLER
    ).select_related("model")


def get_sampler(*, workspace: Workspace, sampler: str) -> TinkerOperation:
    """The save a sampler id names, in this workspace."""
    match = SAMPLER_RE.fullmatch(sampler)
    operation = None
    if match:
        operation = (
            _saves(workspace)
            .filter(model__model_id=match["model"], seq_id=int(match["seq"]))
            .first()
        )
    if operation is None:
        raise NotFound(f"No sampler {sampler} in this workspace.")
    return operation


def resolve_path(*, workspace: Workspace, path: str) -> TinkerOperation:
    """The finished save `tinker://<model_id>/sampler_weights/<name>` of this workspace (the
    newest of that name)."""
    run, _, rest = path.removeprefix("tinker://").partition("/")
    kind, _, name = rest.partition("/")
    operation = None
    if path.startswith("tinker://") and kind == "sampler_weights":
        operation = (
            _saves(workspace)
            .filter(model__model_id=run, payload__name=name, status=OpStatus.DONE)
            .order_by("-seq_id")
            .first()
        )
    if operation is None:
        raise NotFound(f"No sampler weights {path} in this workspace.")
    return operation


def sample(*, save: TinkerOperation, payload: dict) -> TinkerOperation:
    """Queue a sample with the weights of `save` (on its model's worker)."""
    if save.status == OpStatus.FAILED:
        raise VeriError("This sampler's weights were never saved.", code="sampler_failed")
    return sessions.enqueue(
        model=save.model, seq_id=save.seq_id, kind=OpKind.SAMPLE, payload=payload
    )


def base_sampler(*, session: TinkerSession, base_model: str, sampling_seq_id: int) -> str:
    """A sampler of `base_model` itself (`create_sampling_client(base_model=…)`): its own
    worker, which samples once loaded. The same `sampling_seq_id` again is the same sampler."""
    creation = sessions.create_model(
        session=session,
        model_seq_id=BASE_SAMPLER_SEQ + sampling_seq_id,
        base_model=base_model,
        lora=BASE_LORA,
        user_metadata={"veri_sampler": "base"},
    )
    return sampler_id(save_for_sampler(model=creation.model, seq_id=1, name=None))
