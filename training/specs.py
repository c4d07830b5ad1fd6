"""What a job may ask for: methods, hyperparameters with their ranges and defaults, LoRA options,
dataset row shapes, and the reward-source check. Pure functions: no database, no I/O."""

import ast
import json
import re
from dataclasses import dataclass

from veri.errors import VeriError
from worker.rows import row_problem

METHODS = ("grpo", "sft_text", "dpo")
UNAVAILABLE_METHODS = {
    "grpo_agentic": (
        "grpo_agentic is being rebuilt and is not currently runnable as a managed method. To run "
        "multi-turn, environment-based RL today, use a custom script with your own framework (for "
        "example verl) and environment."
    ),
}


@dataclass(frozen=True, slots=True)
class Param:
    kind: type  # int | float | str
    low: float | None = None
    high: float | None = None
    methods: tuple[str, ...] = METHODS
    choices: tuple[str, ...] = ()
    low_exclusive: bool = False


HYPERPARAMETERS = {
    "learning_rate": Param(float, 0, 1, low_exclusive=True),
    "max_steps": Param(int, 1, 1_000_000),
    "epochs": Param(float, 0, 1000, low_exclusive=True),
    "batch_size": Param(int, 1, 4096),
    "micro_batch_size": Param(int, 1, 4096),
    "gradient_accumulation_steps": Param(int, 1, 1024),
    "warmup_ratio": Param(float, 0, 1),
    "weight_decay": Param(float, 0, 1),
    "lr_scheduler": Param(str, choices=("linear", "cosine", "constant", "constant_with_warmup")),
    "seed": Param(int, 0, 2**31 - 1),
    "max_seq_length": Param(int, 8, 131_072, methods=("sft_text", "dpo")),
    "rollouts_per_prompt": Param(int, 2, 64, methods=("grpo",)),
    "max_response_length": Param(int, 1, 32_768, methods=("grpo",)),
    "temperature": Param(float, 0, 10, methods=("grpo",), low_exclusive=True),
    "kl_coef": Param(float, 0, 10, methods=("grpo",)),
    "beta": Param(float, 0, 10, methods=("dpo",), low_exclusive=True),
}

DEFAULTS = {
    "grpo": {
        "learning_rate": 1e-5,
        "max_steps": 50,
        "batch_size": 16,
        "rollouts_per_prompt": 8,
        "max_response_length": 256,
        "temperature": 1.0,
        "kl_coef": 0.0,
        "warmup_ratio": 0.0,
        "lr_scheduler": "constant",
        "seed": 42,
    },
    "sft_text": {
        "learning_rate": 2e-4,
        "epochs": 1,
        "batch_size": 8,
        "max_seq_length": 1024,
        "warmup_ratio": 0.0,
        "lr_scheduler": "linear",
        "seed": 42,
    },
    "dpo": {
        "learning_rate": 5e-5,
        "epochs": 1,
        "batch_size": 8,
        "beta": 0.1,
        "max_seq_length": 1024,
        "warmup_ratio": 0.0,
        "lr_scheduler": "linear",
        "seed": 42,
    },
}

MODULE_NAME_RE = re.compile(r"[A-Za-z0-9_.]{1,100}")
LORA_DEFAULTS = {
    "r": 16,
    "alpha": 32,
    "dropout": 0.05,
    "target_modules": "all-linear",
    "quantization": None,
    "unsloth": False,
}


def _number(value, param: Param, field: str):
    if param.kind is str:
        if value not in param.choices:
            raise VeriError(
                f"{field} must be one of {', '.join(param.choices)}.",
                field=field,
                code="invalid_hyperparameter",
            )
        return value
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise VeriError(f"{field} must be a number.", field=field, code="invalid_hyperparameter")
    if param.kind is int and value != int(value):
        raise VeriError(
            f"{field} must be a whole number.", field=field, code="invalid_hyperparameter"
        )
    value = param.kind(value)
    too_low = param.low is not None and (
        value <= param.low if param.low_exclusive else value < param.low
    )
    too_high = param.high is not None and value > param.high
    if too_low or too_high:
        low = f"above {param.low}" if param.low_exclusive else f"at least {param.low}"
        raise VeriError(
            f"{field} must be {low} and at most {param.high}; got {value}.",
            field=field,
            code="invalid_hyperparameter",
        )
    return value


def validate_hyperparameters(method: str, given: dict) -> dict:
    """The effective hyperparameters: the method's defaults with the given values checked on top."""
    if not isinstance(given, dict):
        raise VeriError("hyperparameters must be an object.", field="hyperparameters")
    effective = dict(DEFAULTS[method])
    for name, value in given.items():
        field = f"hyperparameters.{name}"
        param = HYPERPARAMETERS.get(name)
        if param is None:
            raise VeriError(
                f"Unknown hyperparameter {name!r}; known: {', '.join(sorted(HYPERPARAMETERS))}.",
                field=field,
                code="unknown_hyperparameter",
            )
        if method not in param.methods:
            raise VeriError(
                f"{name} does not apply to {method} (only {', '.join(param.methods)}).",
                field=field,
                code="invalid_hyperparameter",
            )
        effective[name] = _number(value, param, field)
    if "micro_batch_size" in effective and effective["micro_batch_size"] > effective["batch_size"]:
        raise VeriError(
            "micro_batch_size cannot be larger than batch_size.",
            field="hyperparameters.micro_batch_size",
            code="invalid_hyperparameter",
        )
    if method == "grpo" and effective["batch_size"] % effective["rollouts_per_prompt"]:
        raise VeriError(
            f"For GRPO, batch_size ({effective['batch_size']}) must be a multiple of "
            f"rollouts_per_prompt ({effective['rollouts_per_prompt']}): each prompt's rollouts "
            "are scored together.",
            field="hyperparameters.batch_size",
            code="invalid_hyperparameter",
        )
    return effective


def validate_lora(given: dict | None, *, gpu_type: str) -> dict:
    if given is None:
        given = {}
    if not isinstance(given, dict):
        raise VeriError("lora must be an object.", field="lora")
    unknown = set(given) - set(LORA_DEFAULTS)
    if unknown:
        name = sorted(unknown)[0]
        raise VeriError(
            f"Unknown lora option {name!r}; known: {', '.join(LORA_DEFAULTS)}.",
            field=f"lora.{name}",
            code="invalid_lora",
        )
    lora = LORA_DEFAULTS | given
    checks = [
        (
            "r",
            isinstance(lora["r"], int)
            and not isinstance(lora["r"], bool)
            and 1 <= lora["r"] <= 512,
            "a whole number from 1 to 512",
        ),
        (
            "alpha",
            isinstance(lora["alpha"], int | float) and 0 < lora["alpha"] <= 4096,
            "a number above 0 and at most 4096",
        ),
        (
            "dropout",
            isinstance(lora["dropout"], int | float) and 0 <= lora["dropout"] < 1,
            "a number from 0 up to (not including) 1",
        ),
        (
            "target_modules",
            lora["target_modules"] == "all-linear"
            or (
                isinstance(lora["target_modules"], list)
                and 1 <= len(lora["target_modules"]) <= 64
                and all(
                    isinstance(m, str) and MODULE_NAME_RE.fullmatch(m)
                    for m in lora["target_modules"]
                )
            ),
            '"all-linear" or a list of 1 to 64 module names (letters, digits, _ and .)',
        ),
        ("quantization", lora["quantization"] in (None, "4bit"), 'null (LoRA) or "4bit" (QLoRA)'),
        ("unsloth", isinstance(lora["unsloth"], bool), "true or false"),
    ]
    for name, ok, expected in checks:
        if not ok:
            raise VeriError(
                f"lora.{name} must be {expected}.", field=f"lora.{name}", code="invalid_lora"
            )
    if isinstance(lora["target_modules"], list) and "lm_head" in lora["target_modules"]:
        raise VeriError(
            "lm_head cannot be a LoRA target.", field="lora.target_modules", code="invalid_lora"
        )
    if gpu_type == "cpu" and (lora["quantization"] or lora["unsloth"]):
        option = "QLoRA (quantization: 4bit)" if lora["quantization"] else "Unsloth"
        raise VeriError(
            f"{option} needs a CUDA GPU; gpu_type cpu cannot run it.",
            field="lora.quantization" if lora["quantization"] else "lora.unsloth",
            code="invalid_lora",
        )
    return lora


def scan_jsonl(lines) -> tuple[int, dict]:
    """Row count, and for each method the first line that does not fit it (1-based) and why.
    Raises VeriError(invalid_dataset) on a line that is not JSON."""
    first_bad: dict[str, dict] = {}
    count = 0
    for number, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        try:
            row = json.loads(raw)
        except ValueError as exc:
            raise VeriError(
                f"line {number} is not valid JSON ({exc}).",
                field="file",
                code="invalid_dataset",
            ) from None
        except RecursionError:
            raise VeriError(
                f"line {number} is nested too deeply to read.", field="file", code="invalid_dataset"
            ) from None
        count += 1
        for method in METHODS:
            if method not in first_bad and (problem := row_problem(method, row)):
                first_bad[method] = {"line": number, "problem": problem}
    if count == 0:
        raise VeriError("The file has no rows.", field="file", code="invalid_dataset")
    return count, first_bad


# Model hub ids (`owner/name` or `name`): never a path, so a worker cannot be pointed at a folder.
HUB_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}(/[A-Za-z0-9][A-Za-z0-9._-]{0,95})?")
HUB_SPLIT_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:%+\[\]-]{0,99}")  # `train`, `train[:10%]`
HUB_REVISION_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}")  # a branch, tag or commit


def is_hub_id(value: object) -> bool:
    return isinstance(value, str) and bool(HUB_ID_RE.fullmatch(value))


REWARD_DECORATORS = {"reward_function", "reward", "training_job"}


def check_reward_source(source: str) -> None:
    """The reward must parse and define `reward(...)` or a function decorated with
    `@reward_function`. It is customer code: parsed here, run only on the worker."""
    if not isinstance(source, str) or not source.strip():
        raise VeriError(
            "grpo needs reward_source: Python defining `def reward(...)`.",
            field="reward_source",
            code="invalid_reward",
        )
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        raise VeriError(
            f"reward_source does not parse: line {exc.lineno}: {exc.msg}.",
            field="reward_source",
            code="invalid_reward",
        ) from None
    except (RecursionError, MemoryError):
        raise VeriError(
            "reward_source does not parse: an expression is nested too deeply for Python's parser.",
            field="reward_source",
            code="invalid_reward",
        ) from None

    def decorator_name(node) -> str:
        node = node.func if isinstance(node, ast.Call) else node
        return node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", "")

    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and (
            node.name == "reward"
            or any(decorator_name(d) in REWARD_DECORATORS for d in node.decorator_list)
        ):
            return
    raise VeriError(
        "reward_source must define a top-level function named `reward` (or one decorated with "
        "@reward_function).",
        field="reward_source",
        code="invalid_reward",
    )
