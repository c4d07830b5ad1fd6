"""`python -m worker tinker --model ID --api URL` (the model token in VERI_TINKER_TOKEN): a Tinker
training client's model, held for the session's life. It registers, fetches the base model from
the presigned URLs its spec gives, builds the LoRA and its optimizer, then pulls the model's
operations from the control plane in the client's order, runs each and posts its result. It
exits when the control plane says the model ended (410): the session ended or went idle.

It samples with transformers, in this process, or with `--sampler vllm` (a GPU machine, whose
bootstrap installed vLLM) through vLLM's server beside it (worker/tinker_vllm.py).

A request the customer got wrong (a missing loss input, an unknown loss) fails that request
alone; anything else is the worker's fault: it is reported and the model ends."""

import os
import sys
import time
import traceback
from pathlib import Path

import httpx

from worker.client import ControlPlane, ControlPlaneError
from worker.serve import fetch_files
from worker.tinker_losses import LossInputError
from worker.tinker_vllm import EngineFailed, VllmSampler

POLL_WAIT_SECONDS = 10.0
# While vLLM starts, the poll for work is held this long only: one that exits as it starts (a
# model it cannot load, no memory) ends the model within a second, not a held poll later.
STARTING_POLL_WAIT_SECONDS = 1.0


def load(spec: dict, work: Path):
    from worker.tinker_model import TinkerModel  # torch loads only where a model is trained

    base = spec["base_model"]
    if base.get("files"):
        path = fetch_files(httpx.Client(timeout=600), base["files"], work / "base")
    else:
        path = base["name"]  # a hub id, which the provider said its workers can load
    return TinkerModel(path, spec["lora"])


def save(api: ControlPlane, model, operation: dict, work: Path, *, optimizer: bool) -> dict:
    """The model's state (its LoRA adapter, and the optimizer's with `optimizer`) into files,
    uploaded to the URLs the control plane signs for them."""
    folder = work / "saves" / operation["request_id"]
    saved = model.save(folder, optimizer=optimizer)
    files = [{"path": p.name, "size": p.stat().st_size} for p in saved]
    targets = api.call(
        "POST", f"/operations/{operation['request_id']}/uploads", json={"files": files}
    )
    with httpx.Client(timeout=600) as http:
        for target in targets["files"]:
            headers = {**target["headers"], "Content-Type": "application/octet-stream"}
            data = (folder / target["path"]).read_bytes()
            http.put(target["url"], content=data, headers=headers).raise_for_status()
    return {"files": files}


def load_state(model, load: dict, work: Path, request_id: str) -> None:
    folder = work / "loads" / request_id
    fetch_files(httpx.Client(timeout=600), load["files"], folder)
    model.load(folder, optimizer=load["optimizer"])


def run_operation(api: ControlPlane, model, sampler, operation: dict, work: Path) -> dict:
    kind, payload = operation["kind"], operation["payload"]
    if kind == "create_model":
        if payload.get("load"):  # a model created from a saved state
            load_state(model, payload["load"], work, operation["request_id"])
        return {}
    if kind == "save_weights":
        return save(api, model, operation, work, optimizer=True)
    if kind == "load_weights":
        load_state(model, payload, work, operation["request_id"])
        return {}
    if kind in ("forward_backward", "forward"):
        return model.forward_backward(
            payload["data"],
            payload["loss_fn"],
            payload.get("loss_fn_config") or {},
            backward=kind == "forward_backward",
        )
    if kind == "optim_step":
        return model.optim_step(payload["adam_params"])
    if kind == "save_weights_for_sampler":
        model.snapshot(operation["seq_id"])
        if payload.get("name"):  # its path samples from the store's copy once the model is over
            return save(api, model, operation, work, optimizer=False)
        return {}
    if kind == "sample":  # seq_id: the save_weights_for_sampler whose weights it samples with
        return sampler.sample(operation["seq_id"], payload)
    raise LossInputError(f"This worker does not run {kind!r} operations.")


def serve_model(*, model_id: str, api_url: str, sampler: str = "transformers") -> int:
    token = os.environ.pop("VERI_TINKER_TOKEN", None)
    if not token:
        print("VERI_TINKER_TOKEN is not set", file=sys.stderr)
        return 2
    api = ControlPlane(api_url=api_url, job_id=model_id, token=token, kind="tinker_models")
    spec = api.call("POST", "/register")
    work = Path(os.environ.get("VERI_WORK_DIR") or f"/tmp/veri-tinker-{model_id}")
    try:
        model = load(spec, work)
    except Exception as exc:  # noqa: BLE001 - whatever the model files did, it is reported
        traceback.print_exc()
        message = f"{type(exc).__name__}: {exc}"[:10_000]
        api.call("POST", "/failed", json={"code": "model_load_error", "message": message})
        return 1
    engine = None
    try:
        if sampler == "vllm":
            engine = VllmSampler(model, rank=int(spec["lora"]["rank"]), work=work)
        print(f"[veri] tinker model {model_id} loaded; waiting for operations", flush=True)
        return _operations(api, model, engine, work)
    except EngineFailed as exc:
        api.call("POST", "/failed", json={"code": exc.code, "message": str(exc)[:10_000]})
        return 1
    finally:
        if engine is not None:
            engine.stop()


def _operations(api: ControlPlane, model, engine: VllmSampler | None, work: Path) -> int:
    """Run the model's operations as the control plane hands them over, until it ends."""
    after = -1  # the creation (seq 0) is the first operation
    while True:
        if engine is not None and (message := engine.failure()):  # vLLM exited meanwhile
            raise EngineFailed(message)
        starting = engine is not None and not engine.started()
        wait = STARTING_POLL_WAIT_SECONDS if starting else POLL_WAIT_SECONDS
        try:
            answer = api.call("POST", "/next", json={"after": after, "wait": wait})
        except ControlPlaneError as exc:
            if exc.status in (401, 410):  # the model ended: its token died with it
                print(f"[veri] model ended: {exc}", flush=True)
                return 0
            raise
        operation = answer.get("operation")
        if operation is None:
            continue
        started = time.monotonic()
        try:
            result = run_operation(api, model, engine or model, operation, work)
            body = {"ok": True, "result": result}
        except LossInputError as exc:
            body = {"ok": False, "error": str(exc)}
        except EngineFailed:
            raise
        except Exception as exc:  # noqa: BLE001 - the worker's own fault ends the model
            traceback.print_exc()
            message = f"{operation['kind']} failed: {type(exc).__name__}: {exc}"[:10_000]
            api.call("POST", "/failed", json={"code": "worker_failed", "message": message})
            return 1
        api.call("POST", f"/operations/{operation['request_id']}", json=body)
        took = time.monotonic() - started
        print(f"[veri] #{operation['seq_id']} {operation['kind']} in {took:.2f}s", flush=True)
        after = max(after, operation["seq_id"])  # a sample runs out of order, behind its save
