"""What a job may ask for: methods, hyperparameters with their ranges and defaults, LoRA options,
dataset row shapes, and the reward-source check. Pure functions: no database, no I/O."""

import ast
import json
import re
from collections.abc import Callable
from dataclasses import dataclass

from rest_framework import serializers
from rest_framework.fields import empty

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
    # With a validation dataset: evaluate every eval_interval steps (default: at each
    # checkpoint_every, else every tenth of the steps), on its first eval_samples rows (default:
    # all). Without one they change nothing.
    "eval_interval": Param(int, 1, 1_000_000),
    "eval_samples": Param(int, 1, 1_000_000),
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


class _Given(serializers.Field):
    """A field that takes the JSON value as sent: null too, checked like any other value (DRF
    would answer its own "may not be null")."""

    def validate_empty_values(self, data):
        return super().validate_empty_values(data) if data is empty else (False, data)


class _Refused(_Given):
    """A key refused whatever its value: unknown, or not for this method."""

    def __init__(self, message: str, *, code: str):
        super().__init__()
        self.message, self.code = message, code

    def to_internal_value(self, data):
        raise serializers.ValidationError(self.message, code=self.code)


class HyperparameterField(_Given):
    """One hyperparameter: a JSON number (never a string or a boolean), whole for an int, within
    its range; or one of its choices."""

    def __init__(self, param: Param):
        super().__init__()
        self.param = param

    def to_internal_value(self, value):
        param, field = self.param, f"hyperparameters.{self.field_name}"
        if param.kind is str:
            if value not in param.choices:
                self.refuse(f"{field} must be one of {', '.join(param.choices)}.")
            return value
        if isinstance(value, bool) or not isinstance(value, int | float):
            self.refuse(f"{field} must be a number.")
        if param.kind is int and value != int(value):
            self.refuse(f"{field} must be a whole number.")
        value = param.kind(value)
        too_low = param.low is not None and (
            value <= param.low if param.low_exclusive else value < param.low
        )
        too_high = param.high is not None and value > param.high
        if too_low or too_high:
            low = f"above {param.low}" if param.low_exclusive else f"at least {param.low}"
            self.refuse(f"{field} must be {low} and at most {param.high}; got {value}.")
        return value

    @staticmethod
    def refuse(message: str):
        raise serializers.ValidationError(message, code="invalid_hyperparameter")


class HyperparametersIn(serializers.Serializer):
    """A method's hyperparameters. One field per given key, in the order given, so the first
    problem reported is the first key's; then the rules across keys, on the method's defaults
    with the given values on top (which `validated_data` is)."""

    def __init__(self, *, method: str, data: dict):
        self.method = method
        super().__init__(data=data)

    def get_fields(self) -> dict[str, serializers.Field]:
        fields: dict[str, serializers.Field] = {}
        for name in self.initial_data:
            param = HYPERPARAMETERS.get(name)
            if param is None:
                known = ", ".join(sorted(HYPERPARAMETERS))
                fields[name] = _Refused(
                    f"Unknown hyperparameter {name!r}; known: {known}.",
                    code="unknown_hyperparameter",
                )
            elif self.method not in param.methods:
                fields[name] = _Refused(
                    f"{name} does not apply to {self.method} (only {', '.join(param.methods)}).",
                    code="invalid_hyperparameter",
                )
            else:
                fields[name] = HyperparameterField(param)
        return fields

    def validate(self, attrs: dict) -> dict:
        effective = DEFAULTS[self.method] | dict(attrs)
        if (
            "micro_batch_size" in effective
            and effective["micro_batch_size"] > effective["batch_size"]
        ):
            raise serializers.ValidationError(
                {"micro_batch_size": "micro_batch_size cannot be larger than batch_size."},
                code="invalid_hyperparameter",
            )
        if self.method == "grpo" and effective["batch_size"] % effective["rollouts_per_prompt"]:
            raise serializers.ValidationError(
                {
                    "batch_size": f"For GRPO, batch_size ({effective['batch_size']}) must be a "
                    f"multiple of rollouts_per_prompt ({effective['rollouts_per_prompt']}): each "
                    "prompt's rollouts are scored together."
                },
                code="invalid_hyperparameter",
            )
        return effective


def _validated(serializer: serializers.Serializer, *, prefix: str) -> dict:
    """The serializer's validated data; else its first error, as the VeriError on
    `<prefix>.<field>` with the error's code."""
    if serializer.is_valid():
        return serializer.validated_data
    name, details = next(iter(serializer.errors.items()))
    raise VeriError(str(details[0]), field=f"{prefix}.{name}", code=details[0].code)


def validate_hyperparameters(method: str, given: dict) -> dict:
    """The effective hyperparameters: the method's defaults with the given values checked on top."""
    if not isinstance(given, dict):
        raise VeriError("hyperparameters must be an object.", field="hyperparameters")
    return _validated(HyperparametersIn(method=method, data=given), prefix="hyperparameters")


class LoraOption(_Given):
    """One LoRA option: the JSON value as sent when `accepts` it, else `lora.<name> must be
    <expected>.`"""

    def __init__(self, *, default, accepts: Callable[[object], bool], expected: str):
        super().__init__(default=default)
        self.accepts, self.expected = accepts, expected

    def to_internal_value(self, value):
        if not self.accepts(value):
            raise serializers.ValidationError(
                f"lora.{self.field_name} must be {self.expected}.", code="invalid_lora"
            )
        return value


def _module_names(value) -> bool:
    return (
        isinstance(value, list)
        and 1 <= len(value) <= 64
        and all(isinstance(m, str) and MODULE_NAME_RE.fullmatch(m) for m in value)
    )


class LoraIn(serializers.Serializer):
    """LoRA options over `LORA_DEFAULTS`; an unknown option is refused before any is checked, and
    the options are checked in this order. `context["gpu_type"]`: the job's GPU."""

    r = LoraOption(
        default=LORA_DEFAULTS["r"],
        accepts=lambda v: isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= 512,
        expected="a whole number from 1 to 512",
    )
    alpha = LoraOption(
        default=LORA_DEFAULTS["alpha"],
        accepts=lambda v: isinstance(v, int | float) and 0 < v <= 4096,
        expected="a number above 0 and at most 4096",
    )
    dropout = LoraOption(
        default=LORA_DEFAULTS["dropout"],
        accepts=lambda v: isinstance(v, int | float) and 0 <= v < 1,
        expected="a number from 0 up to (not including) 1",
    )
    target_modules = LoraOption(
        default=LORA_DEFAULTS["target_modules"],
        accepts=lambda v: v == "all-linear" or _module_names(v),
        expected='"all-linear" or a list of 1 to 64 module names (letters, digits, _ and .)',
    )
    quantization = LoraOption(
        default=LORA_DEFAULTS["quantization"],
        accepts=lambda v: v in (None, "4bit"),
        expected='null (LoRA) or "4bit" (QLoRA)',
    )
    unsloth = LoraOption(
        default=LORA_DEFAULTS["unsloth"],
        accepts=lambda v: isinstance(v, bool),
        expected="true or false",
    )

    def to_internal_value(self, data):
        if unknown := set(data) - set(LORA_DEFAULTS):
            name = sorted(unknown)[0]
            raise serializers.ValidationError(
                {name: [f"Unknown lora option {name!r}; known: {', '.join(LORA_DEFAULTS)}."]},
                code="invalid_lora",
            )
        return super().to_internal_value(data)

    def validate(self, attrs: dict) -> dict:
        lora = dict(attrs)
        if isinstance(lora["target_modules"], list) and "lm_head" in lora["target_modules"]:
            raise serializers.ValidationError(
                {"target_modules": "lm_head cannot be a LoRA target."}, code="invalid_lora"
            )
        if self.context["gpu_type"] == "cpu" and (lora["quantization"] or lora["unsloth"]):
            option = "QLoRA (quantization: 4bit)" if lora["quantization"] else "Unsloth"
            field = "quantization" if lora["quantization"] else "unsloth"
            raise serializers.ValidationError(
                {field: f"{option} needs a CUDA GPU; gpu_type cpu cannot run it."},
                code="invalid_lora",
            )
        return lora


def validate_lora(given: dict | None, *, gpu_type: str) -> dict:
    if given is None:
        given = {}
    if not isinstance(given, dict):
        raise VeriError("lora must be an object.", field="lora")
    return _validated(LoraIn(data=given, context={"gpu_type": gpu_type}), prefix="lora")


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
