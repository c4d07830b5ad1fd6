"""Sampling: `save_weights_for_sampler` keeps the model's LoRA weights as they are at that point of
its order (in its worker's memory), and a sampler is those weights: its id is
`<model_id>:sample:<seq_id>` of that save, a named save is also addressed as
`tinker://<model_id>/sampler_weights/<name>`. Samples run on the model's worker, between its
other operations, with the saved weights. An unnamed sampler lives as long as its model.

A named save's worker also uploads its LoRA adapter to the store: a checkpoint of the workspace
(tinker_api.services.checkpoints), listed, downloaded, deployed and deleted as a `save_state`'s.
Once its model is over (ended, failed, or its session closed), its path still makes a sampler,
on a sampling-only model of the caller's session whose worker loads the base model and that
adapter.

A base model's sampler (no weights) is such a model too, never trained: a rank-1 LoRA whose
second matrix starts at zero (PEFT's initialisation), so it computes exactly the base model.
A sampling-only model is billed as any model of its session."""

import re

from tinker_api.models import (
    SAMPLER_SEQ,
    CheckpointKind,
    ModelStatus,
    OpKind,
    OpStatus,
    TinkerCheckpoint,
    TinkerModel,
    TinkerOperation,
    TinkerSession,
)
from tinker_api.services import checkpoints, sessions, stability
from tinker_api.services.checkpoints import NAME_RE
from veri.errors import NotFound, VeriError
from veri.models import Workspace

SAMPLER_RE = re.compile(r"^(?P<model>.+):sample:(?P<seq>[0-9]{1,9})$")
MAX_SAMPLES = 64
MAX_TOKENS = 4096
SAMPLER_KEY = "veri_sampler"  # a sampling-only model's user_metadata: "base", or the path it loaded
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
    operation = sessions.enqueue(
        model=model, seq_id=seq_id, kind=OpKind.SAVE_FOR_SAMPLER, payload=payload
    )
    if name:
        checkpoints.record(operation=operation, name=name, kind=CheckpointKind.SAMPLER)
    return operation


def model_path(save: TinkerOperation) -> str | None:
    """The path a sampler was made from: its named save's, or the one its sampling-only model
    loaded."""
    if save.payload.get("name"):
        return sampler_path(save)
    loaded = save.model.user_metadata.get(SAMPLER_KEY)
    return loaded if isinstance(loaded, str) and loaded.startswith("tinker://") else None


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


def resolve_path(*, workspace: Workspace, path: str) -> TinkerCheckpoint:
    """The saved sampler weights `tinker://<model_id>/sampler_weights/<name>` of this workspace
    (the newest of that name)."""
    try:
        kinds = (CheckpointKind.SAMPLER,)
        return checkpoints.resolve(workspace=workspace, path=path, kinds=kinds)
    except NotFound:
        raise NotFound(f"No sampler weights {path} in this workspace.") from None


def sample(*, save: TinkerOperation, payload: dict, record: bool = False) -> TinkerOperation:
    """Queue a sample with the weights of `save` (on its model's worker); `record` keeps its
    sequences for stable_reinforce (tinker_api.services.stability)."""
    if save.status == OpStatus.FAILED:
        raise VeriError("This sampler's weights were never saved.", code="sampler_failed")
    operation = sessions.enqueue(
        model=save.model, seq_id=save.seq_id, kind=OpKind.SAMPLE, payload=payload
    )
    if record:
        stability.record(operation)
    return operation


def path_sampler(*, session: TinkerSession, path: str, sampling_seq_id: int) -> str:
    """A sampler of the named save `path` (`create_sampling_client(model_path=…)`): on its
    model's worker while that model is ready in an open session; else a sampling-only model of
    `session` that loads the adapter the save kept in the store."""
    saved = resolve_path(workspace=session.workspace, path=path)
    model = saved.model
    if model.status == ModelStatus.READY and model.session.ended_at is None:
        return sampler_id(saved.operation)
    return _sampler_model(
        session=session,
        sampling_seq_id=sampling_seq_id,
        base_model=model.base_model,
        lora=model.lora,
        user_metadata={SAMPLER_KEY: path},
        load=checkpoints.load_payload(saved, optimizer=False),
    )


def base_sampler(*, session: TinkerSession, base_model: str, sampling_seq_id: int) -> str:
    """A sampler of `base_model` itself (`create_sampling_client(base_model=…)`)."""
    return _sampler_model(
        session=session,
        sampling_seq_id=sampling_seq_id,
        base_model=base_model,
        lora=BASE_LORA,
        user_metadata={SAMPLER_KEY: "base"},
    )


def _sampler_model(
    *,
    session: TinkerSession,
    sampling_seq_id: int,
    base_model: str,
    lora: dict,
    user_metadata: dict,
    load: dict | None = None,
) -> str:
    """A sampling-only model: its own worker, which samples once loaded (and `load`'s adapter
    loaded into it). The same `sampling_seq_id` again is the same sampler."""
    creation = sessions.create_model(
        session=session,
        model_seq_id=SAMPLER_SEQ + sampling_seq_id,
        base_model=base_model,
        lora=lora,
        user_metadata=user_metadata,
        load=load,
    )
    return sampler_id(save_for_sampler(model=creation.model, seq_id=1, name=None))
