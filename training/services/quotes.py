"""What a job will cost, before anything is rented: GPU time from the model's size, the dataset's
tokens and the GPU's throughput, as a range, with every assumption stated."""

import json
import math
import re
from datetime import timedelta

from providers import catalog
from training.models import Dataset
from training.services.jobs import Plan, Submission, plan_job
from veri.models import Workspace
from veri.money import micros_for
from volumes import selectors as volume_selectors
from volumes.stores import StoreError, store_for

CHARS_PER_TOKEN = 4
MFU = 0.3  # the share of peak throughput LoRA training reaches
GENERATION_SECONDS_PER_TOKEN = 0.02  # GRPO rollouts are generated token by token
DEFAULT_PARAMETERS = 1_000_000_000
DEFAULT_ROWS, DEFAULT_TOKENS_PER_ROW = 1000, 256
LOW, HIGH = 0.7, 2.0
SIZE_IN_NAME = re.compile(r"(\d+(?:\.\d+)?)\s*([bm])\b", re.IGNORECASE)


def _size(config: dict, key: str, default: int | None = None) -> int:
    """A whole, positive size from a model config, or ValueError (it is the customer's file)."""
    value = config.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < 10**7:
        raise ValueError(f"{key} is not a size")
    return value


def parameters_from_config(config: dict) -> int:
    """A decoder's parameter count from its `config.json` (embeddings, attention, MLP)."""
    if not isinstance(config, dict):
        raise ValueError("not an object")
    hidden, layers = _size(config, "hidden_size"), _size(config, "num_hidden_layers")
    vocab = _size(config, "vocab_size", 32_000)
    intermediate = _size(config, "intermediate_size", 4 * hidden)
    heads = _size(config, "num_attention_heads", 1)
    kv = min(_size(config, "num_key_value_heads", heads), heads)
    attention = 2 * hidden * hidden + 2 * hidden * (hidden * kv // heads)
    embeddings = vocab * hidden * (1 if config.get("tie_word_embeddings", True) else 2)
    return int(embeddings + layers * (attention + 3 * hidden * intermediate))


def _model_size(plan: Plan) -> tuple[int, str]:
    base = plan.sub.base_model
    if base.startswith("volume://"):
        name, _, folder = base.removeprefix("volume://").partition("/")
        volume = next(v for v in plan.volumes if name in (v.name, v.public_id))
        path = f"{folder.rstrip('/')}/config.json" if folder else "config.json"
        file = volume_selectors.get_file(volume=volume, path=path)
        if file and file.size <= 1024**2:
            try:
                store = store_for(volume.store_prefix)
                config = json.loads(store.get_bytes(file.object_key, byte_range=file.byte_range))
                return parameters_from_config(config), f"from {base}/config.json"
            except (StoreError, ValueError, RecursionError):
                pass  # not a config we can read: the name, or the default, below
    if match := SIZE_IN_NAME.search(base.rsplit("/", 1)[-1]):
        scale = 1e9 if match.group(2).lower() == "b" else 1e6
        return int(float(match.group(1)) * scale), f"from the name {base!r}"
    return DEFAULT_PARAMETERS, "unknown: assumed 1B"


def _dataset_shape(dataset: Dataset) -> tuple[int, int, str]:
    """Rows and tokens per row."""
    if dataset.source == Dataset.Source.UPLOAD and dataset.row_count:
        per_row = max(1, dataset.size_bytes // dataset.row_count // CHARS_PER_TOKEN)
        return dataset.row_count, per_row, "counted at upload (4 characters a token)"
    return DEFAULT_ROWS, DEFAULT_TOKENS_PER_ROW, "unknown before the worker reads it: assumed"


def quote_job(*, workspace: Workspace, submission: Submission) -> dict:
    plan = plan_job(workspace=workspace, submission=submission)
    hp, method = plan.hyperparameters, plan.sub.method
    parameters, parameters_source = _model_size(plan)
    rows, tokens_per_row, rows_source = _dataset_shape(plan.dataset)
    batch = hp["batch_size"]
    steps = hp.get("max_steps") or math.ceil(hp.get("epochs", 1) * rows / batch)
    if method == "grpo":
        tokens_per_step = batch * (tokens_per_row + hp["max_response_length"])
        generation = steps * hp["max_response_length"] * GENERATION_SECONDS_PER_TOKEN
    else:
        length = min(tokens_per_row, hp.get("max_seq_length", tokens_per_row))
        tokens_per_step = batch * length * (3 if method == "dpo" else 1)  # pairs + reference
        generation = 0.0
    flops = 6 * parameters * tokens_per_step * steps
    throughput = plan.gpu.tflops * 1e12 * MFU * plan.sub.gpu_count
    boot = catalog.get_provider(plan.provider).boot_seconds
    expected = boot + flops / throughput + generation
    price = plan.price_per_hour_micros

    def cost(seconds: float) -> int:
        micros = micros_for(price_per_hour_micros=price, elapsed=timedelta(seconds=seconds))
        return min(micros, plan.max_cost_micros) if plan.max_cost_micros else micros

    seconds = {"low": expected * LOW, "expected": expected, "high": expected * HIGH}
    return {
        "provider": plan.provider,
        "region": plan.region,
        "gpu_type": plan.gpu.name,
        "gpu_count": plan.sub.gpu_count,
        "price_per_hour_micros": price,
        "gpu_seconds": {k: round(v) for k, v in seconds.items()},
        "cost_micros": {k: cost(v) for k, v in seconds.items()},
        "max_cost_micros": plan.max_cost_micros,
        "assumptions": {
            "parameters": parameters,
            "parameters_source": parameters_source,
            "dataset_rows": rows,
            "tokens_per_row": tokens_per_row,
            "dataset_source": rows_source,
            "steps": steps,
            "tokens_per_step": tokens_per_step,
            "gpu_peak_tflops": plan.gpu.tflops,
            "utilization": MFU,
            "boot_seconds": boot,
            "generation_seconds_per_token": GENERATION_SECONDS_PER_TOKEN if method == "grpo" else 0,
            "range": f"{LOW}x to {HIGH}x the expected time",
        },
    }
