"""The `tinker` rest client, unmodified, lists the workspace's training runs, sessions and saved
checkpoints (saved states and named sampler weights), reads a checkpoint's LoRA, and deletes
one; the checkpoint's adapter downloads as an archive PEFT loads. Another workspace's are the
client's not-found error."""

import importlib
import io
import tarfile
from datetime import timedelta

import httpx
import pytest
import tinker
import torch
from django.apps import apps
from django.utils import timezone
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import AutoModelForCausalLM

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
from tinker_api.services import checkpoints, keys
from veri import services as veri_services
from veri.errors import NotFound, VeriError
from volumes.stores import keys as store_keys
from volumes.stores import store_for

pytestmark = pytest.mark.django_db(transaction=True, serialized_rollback=True)


def new_session(workspace) -> TinkerSession:
    return TinkerSession.objects.create(workspace=workspace, last_heartbeat_at=timezone.now())


def new_model(session, base_model: str, seq: int = 0) -> TinkerModel:
    return TinkerModel.objects.create(
        session=session,
        workspace=session.workspace,
        model_id=f"{session.public_id}:train:{seq}",
        model_seq_id=seq,
        base_model=base_model,
        lora={"rank": 4, "train_mlp": True, "train_attn": True, "train_unembed": False},
        user_metadata={"experiment": 7},
        status=ModelStatus.READY,
        provider="local",
        gpu_type="cpu",
    )


def save_checkpoint(
    model: TinkerModel,
    tiny_model,
    folder,
    name: str = "after-3",
    kind: CheckpointKind = CheckpointKind.STATE,
):
    """What a worker's `save_state` leaves (or, of `kind` SAMPLER, a named
    `save_weights_for_sampler`'s): a real PEFT adapter of the tiny model (and the optimizer's
    state, for a state) in the checkpoint's folder of the store, its row complete. Returns the
    checkpoint and the adapter's weights."""
    peft = get_peft_model(
        AutoModelForCausalLM.from_pretrained(tiny_model),
        LoraConfig(r=4, target_modules="all-linear", init_lora_weights=False),
    )
    peft.save_pretrained(folder)
    if kind == CheckpointKind.STATE:
        (folder / "optimizer.pt").write_bytes(b"adam moments")
    seq = model.operations.count() + 1
    operation = TinkerOperation.objects.create(
        model=model,
        seq_id=seq,
        kind=OpKind.SAVE_WEIGHTS if kind == CheckpointKind.STATE else OpKind.SAVE_FOR_SAMPLER,
        payload={"name": name},
        status=OpStatus.DONE,
    )
    checkpoint = TinkerCheckpoint.objects.create(
        model=model, workspace=model.workspace, operation=operation, name=name, kind=kind
    )
    prefix = store_keys.workspace_prefix(model.workspace.public_id).child(
        checkpoints.folder(checkpoint)
    )
    store, files = store_for(prefix), []
    for path in sorted(p for p in folder.iterdir() if p.is_file()):
        store.put_bytes(prefix.key(path.name), path.read_bytes())
        files.append({"path": path.name, "size": path.stat().st_size})
    checkpoint.files = files
    checkpoint.save(update_fields=["files"])
    lora = {k: v.clone() for k, v in peft.state_dict().items() if "lora_" in k}
    return checkpoint, lora


def rest_client(live_server, workspace):
    _, raw = keys.create_key(workspace=workspace)
    return tinker.RestClient(base_url=live_server.url, api_key=raw), raw


def test_the_rest_client_lists_reads_downloads_and_deletes_checkpoints(
    live_server, workspace, tiny_model, tmp_path
):
    session = new_session(workspace)
    model = new_model(session, str(tiny_model))
    checkpoint, lora = save_checkpoint(model, tiny_model, tmp_path / "saved")
    path = f"tinker://{model.model_id}/weights/after-3"
    rest, raw = rest_client(live_server, workspace)

    runs = rest.list_training_runs().result()
    assert runs.cursor.total_count == 1
    [run] = runs.training_runs
    assert (run.training_run_id, run.base_model, run.lora_rank) == (
        model.model_id,
        str(tiny_model),
        4,
    )
    assert run.last_checkpoint.tinker_path == path
    assert run.user_metadata == {"experiment": "7"}
    assert rest.get_training_run(model.model_id).result().training_run_id == model.model_id

    [listed] = rest.list_checkpoints(model.model_id).result().checkpoints
    sizes = sum(f["size"] for f in checkpoint.files)
    assert (listed.checkpoint_id, listed.checkpoint_type, listed.tinker_path) == (
        "weights/after-3",
        "training",
        path,
    )
    assert listed.size_bytes == sizes
    mine = rest.list_user_checkpoints().result()
    assert [c.tinker_path for c in mine.checkpoints] == [path]
    assert mine.cursor.total_count == 1

    info = rest.get_weights_info_by_tinker_path(path).result()
    assert (info.base_model, info.lora_rank, info.train_unembed) == (str(tiny_model), 4, False)
    assert model.model_id in rest.get_session(session.public_id).result().training_run_ids
    assert session.public_id in rest.list_sessions().result().sessions

    # The adapter, downloaded through a short-lived URL that needs no key, is a folder PEFT
    # loads as saved.
    redirect = httpx.get(
        f"{live_server.url}/api/v1/training_runs/{model.model_id}/checkpoints/weights/after-3"
        "/archive",
        headers={"X-API-Key": raw},
    )
    assert redirect.status_code == 302, redirect.text
    response = httpx.get(redirect.headers["Location"])
    assert response.status_code == 200, response.text
    with tarfile.open(fileobj=io.BytesIO(response.content)) as archive:
        names = archive.getnames()
        archive.extractall(tmp_path / "downloaded", filter="data")
    assert sorted(names) == ["after-3/adapter_config.json", "after-3/adapter_model.safetensors"]
    loaded = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(tiny_model), tmp_path / "downloaded" / "after-3"
    )
    got = {k: v for k, v in loaded.state_dict().items() if "lora_" in k}
    assert got.keys() == lora.keys()
    assert all(torch.equal(got[k], lora[k]) for k in lora)

    # Publishing is not supported: a clear error, not a hang.
    with pytest.raises(tinker.BadRequestError, match="does not support"):
        rest.publish_checkpoint_from_tinker_path(path).result()

    rest.delete_checkpoint_from_tinker_path(path).result()
    assert rest.list_checkpoints(model.model_id).result().checkpoints == []
    with pytest.raises(tinker.NotFoundError):
        rest.get_weights_info_by_tinker_path(path).result()
    store = store_for(store_keys.workspace_prefix(workspace.public_id))
    assert list(store.iter_objects(store_keys.workspace_prefix(workspace.public_id))) == []


def test_another_workspaces_runs_and_checkpoints_are_not_found(
    live_server, workspace, tiny_model, tmp_path
):
    model = new_model(new_session(workspace), str(tiny_model))
    save_checkpoint(model, tiny_model, tmp_path / "saved")
    path = f"tinker://{model.model_id}/weights/after-3"
    other, _ = veri_services.create_workspace(name="rival")
    rest, raw = rest_client(live_server, other)

    assert rest.list_training_runs().result().training_runs == []
    assert rest.list_user_checkpoints().result().checkpoints == []
    for call in (
        lambda: rest.get_training_run(model.model_id),
        lambda: rest.list_checkpoints(model.model_id),
        lambda: rest.get_weights_info_by_tinker_path(path),
        lambda: rest.delete_checkpoint_from_tinker_path(path),
        lambda: rest.get_session(model.session.public_id),
    ):
        with pytest.raises(tinker.NotFoundError):
            call().result()
    archive = httpx.get(
        f"{live_server.url}/api/v1/training_runs/{model.model_id}/checkpoints/weights/after-3"
        "/archive",
        headers={"X-API-Key": raw},
    )
    assert archive.status_code == 404
    assert TinkerCheckpoint.objects.filter(model=model).exists()  # the delete did nothing


def test_a_deleted_checkpoint_no_longer_resolves(workspace, tiny_model, tmp_path):
    model = new_model(new_session(workspace), str(tiny_model))
    checkpoint, _ = save_checkpoint(model, tiny_model, tmp_path / "saved")
    path = checkpoints.tinker_path(checkpoint)
    assert checkpoints.resolve(workspace=workspace, path=path) == checkpoint
    checkpoints.delete(checkpoint)
    with pytest.raises(NotFound):
        checkpoints.resolve(workspace=workspace, path=path)


def test_named_sampler_weights_are_sampler_checkpoints_listed_downloaded_and_deleted(
    live_server, workspace, tiny_model, tmp_path
):
    model = new_model(new_session(workspace), str(tiny_model))
    new_model(model.session, str(tiny_model), seq=SAMPLER_SEQ)  # sampling-only: no training run
    save_checkpoint(model, tiny_model, tmp_path / "state", name="s1")
    sampler, lora = save_checkpoint(
        model, tiny_model, tmp_path / "sampler", name="eval", kind=CheckpointKind.SAMPLER
    )
    path = f"tinker://{model.model_id}/sampler_weights/eval"
    assert checkpoints.tinker_path(sampler) == path
    rest, raw = rest_client(live_server, workspace)

    listed = rest.list_checkpoints(model.model_id).result().checkpoints
    assert sorted((c.checkpoint_type, c.checkpoint_id, c.tinker_path) for c in listed) == [
        ("sampler", "sampler_weights/eval", path),
        ("training", "weights/s1", f"tinker://{model.model_id}/weights/s1"),
    ]
    [run] = rest.list_training_runs().result().training_runs
    assert run.last_sampler_checkpoint.tinker_path == path
    assert run.last_checkpoint.tinker_path == f"tinker://{model.model_id}/weights/s1"
    assert rest.get_weights_info_by_tinker_path(path).result().base_model == str(tiny_model)

    # Its archive is the adapter alone, as PEFT loads it.
    redirect = httpx.get(
        f"{live_server.url}/api/v1/training_runs/{model.model_id}/checkpoints/"
        "sampler_weights/eval/archive",
        headers={"X-API-Key": raw},
    )
    assert redirect.status_code == 302, redirect.text
    with tarfile.open(fileobj=io.BytesIO(httpx.get(redirect.headers["Location"]).content)) as tar:
        names = sorted(tar.getnames())
        assert names == ["eval/adapter_config.json", "eval/adapter_model.safetensors"]
        tar.extractall(tmp_path / "downloaded", filter="data")
    loaded = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(tiny_model), tmp_path / "downloaded" / "eval"
    )
    got = {k: v for k, v in loaded.state_dict().items() if "lora_" in k}
    assert all(torch.equal(got[k], lora[k]) for k in lora)

    # Deployments and managed jobs take its path as they take a saved state's; a training
    # client loads its weights, but not an optimizer state it does not hold.
    base, veri_checkpoint = checkpoints.resolve_adapter(workspace=workspace, name=path)
    assert base == str(tiny_model)
    assert veri_checkpoint.files == [f for f in sampler.files if f["path"].startswith("adapter_")]
    assert checkpoints.loadable(workspace=workspace, path=path, optimizer=False) == sampler
    with pytest.raises(VeriError, match="no optimizer state"):
        checkpoints.loadable(workspace=workspace, path=path, optimizer=True)

    rest.delete_checkpoint_from_tinker_path(path).result()
    [left] = rest.list_checkpoints(model.model_id).result().checkpoints
    assert left.checkpoint_type == "training"
    assert checkpoints.resolve_adapter(workspace=workspace, name=path) is None
    prefix = store_keys.workspace_prefix(workspace.public_id)
    assert not any(
        obj.key.startswith(checkpoints.folder(sampler))
        for obj in store_for(prefix).iter_objects(prefix)
    )


def test_sampler_saves_made_before_they_were_checkpoints_become_ones(workspace, tiny_model):
    """Migration tinker_api 0007: a named sampler save that kept its files in its result."""
    model = new_model(new_session(workspace), str(tiny_model))
    finished = timezone.now() - timedelta(days=2)
    files = [{"path": "adapter_model.safetensors", "size": 10}]
    save = TinkerOperation.objects.create(
        model=model,
        seq_id=1,
        kind=OpKind.SAVE_FOR_SAMPLER,
        payload={"name": "old"},
        status=OpStatus.DONE,
        result={"files": files},
        finished_at=finished,
    )
    TinkerOperation.objects.create(  # unnamed: only in its worker's memory
        model=model, seq_id=2, kind=OpKind.SAVE_FOR_SAMPLER, status=OpStatus.DONE, result={}
    )
    migration = importlib.import_module("tinker_api.migrations.0007_sampler_weights_checkpoints")
    migration.sampler_saves_as_checkpoints(apps, None)
    migration.sampler_saves_as_checkpoints(apps, None)  # twice: still one

    [made] = TinkerCheckpoint.objects.filter(model=model)
    assert (made.kind, made.name, made.files) == ("sampler_weights", "old", files)
    assert made.operation == save
    assert made.created_at == finished
    assert checkpoints.folder(made) == f"tinker/{save.request_id}"  # where its files are
    path = f"tinker://{model.model_id}/sampler_weights/old"
    assert checkpoints.resolve(workspace=workspace, path=path, kinds=tuple(CheckpointKind)) == made
