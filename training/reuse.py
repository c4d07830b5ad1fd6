"""A job's spec written out for submitting it again: as the TOML `veri run` reads, as a shell
command line that writes that file (and the reward) and runs it, and as the Python SDK call.
Pure functions of a `Submission` (`training.services.jobs.submission_of`): each way yields the
same submit as the job itself, which the tests check by feeding them to the CLI and the SDK."""

import pprint
import re
from dataclasses import fields

from training import specs
from training.services.jobs import Submission

REWARD_FILE, TOML_FILE = "reward.py", "job.toml"
# Submission fields as the TOML (`veri_sdk.cli.train.TOML_KEYS`) names them; the reward is a file.
TOML_NAMES = {"dataset_id": "dataset", "validation_dataset_id": "validation_dataset"}
_DEFAULTS = {f.name: f.default for f in fields(Submission)}
_ALWAYS = {"base_model", "dataset_id", "method", "gpu_type", "provider", "region"}
_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


def _given(submission: Submission) -> dict:
    """The fields that say something: values left at the submit default are left out (the
    submit fills them in the same), and so are LoRA options set to null, which TOML cannot
    write (null is their only default)."""
    given = {}
    for f in fields(Submission):
        value = getattr(submission, f.name)
        if value is None or (f.name not in _ALWAYS and value in ("", [], {}, _DEFAULTS[f.name])):
            continue
        given[f.name] = str(value) if f.name == "max_cost_usd" else value  # a decimal string
    # Hyperparameters and LoRA options at their defaults (`training.specs`) likewise.
    for name, defaults in (
        ("hyperparameters", specs.DEFAULTS.get(submission.method, {})),
        ("lora", specs.LORA_DEFAULTS),
    ):
        changed = {
            k: v
            for k, v in (given.get(name) or {}).items()
            if v is not None and (k not in defaults or v != defaults[k])
        }
        if changed:
            given[name] = changed
        else:
            given.pop(name, None)
    return given


# TOML


def _toml_string(text: str) -> str:
    escaped = []
    for char in text:
        if char in '"\\':
            escaped.append("\\" + char)
        elif char == "\n":
            escaped.append("\\n")
        elif char == "\t":
            escaped.append("\\t")
        elif ord(char) < 0x20 or ord(char) == 0x7F:
            escaped.append(f"\\u{ord(char):04X}")
        else:
            escaped.append(char)
    return '"' + "".join(escaped) + '"'


def _toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return _toml_string(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"no TOML for {type(value).__name__}")


def _toml_key(key: str) -> str:
    return key if _BARE_KEY.fullmatch(key) else _toml_string(key)


def _toml_table(name: str, table: dict, *, array: bool = False) -> list[str]:
    """`[name]` (or `[[name]]`) with its values, then its sub-tables."""
    lines = [f"[[{name}]]" if array else f"[{name}]"]
    nested = {}
    for key, value in table.items():
        if isinstance(value, dict):
            nested[key] = value
        elif value is not None:
            lines.append(f"{_toml_key(key)} = {_toml_value(value)}")
    for key, value in nested.items():
        lines += ["", *_toml_table(f"{name}.{_toml_key(key)}", value)]
    return lines


def as_toml(submission: Submission) -> str:
    """The job file `veri run job.toml` submits; its reward is read from reward.py beside it."""
    given = _given(submission)
    lines = ['kind = "train"']
    tables = []
    for name, value in given.items():
        key = TOML_NAMES.get(name, name)
        if name == "reward_source":
            lines.append(f"reward = {_toml_string(REWARD_FILE)}")
        elif isinstance(value, dict):
            tables += ["", *_toml_table(key, value)]
        elif isinstance(value, list) and value and isinstance(value[0], dict):
            for item in value:
                tables += ["", *_toml_table(key, item, array=True)]
        else:
            lines.append(f"{key} = {_toml_value(value)}")
    return "\n".join(lines + tables) + "\n"


# The command line


def _heredoc(path: str, text: str) -> str:
    """A shell line writing `text` to `path` byte for byte."""
    if text.endswith("\n"):
        marker = "VERI_EOF"
        while marker in text.splitlines():
            marker += "_"
        return f"cat > {path} <<'{marker}'\n{text}{marker}"
    quoted = "'" + text.replace("'", "'\\''") + "'"
    return f"printf '%s' {quoted} > {path}"


def as_cli(submission: Submission) -> str:
    """Shell lines that write the job file (and its reward) and submit it with the `veri` CLI."""
    parts = []
    if submission.reward_source:
        parts.append(_heredoc(REWARD_FILE, submission.reward_source))
    parts.append(_heredoc(TOML_FILE, as_toml(submission)))
    parts.append(f"veri run {TOML_FILE} --detach")
    return "\n".join(parts) + "\n"


# The SDK


def _python_string(text: str) -> str:
    """A triple-quoted literal when the text reads as itself in one, else its repr."""
    if "\\" not in text and '"""' not in text and not text.endswith('"'):
        return '"""' + text + '"""'
    return repr(text)


def as_sdk(submission: Submission) -> str:
    """A Python script submitting the same job with the SDK (`VERI_API_URL`, `VERI_API_KEY`)."""
    given = _given(submission)
    lines = ["from veri_sdk import Client", ""]
    if "reward_source" in given:
        lines += [f"REWARD = {_python_string(given['reward_source'])}", ""]
    lines.append("job = Client().training_jobs.create(")
    for name, value in given.items():
        literal = "REWARD" if name == "reward_source" else pprint.pformat(value, sort_dicts=False)
        lines.append(f"    {name}={literal.replace(chr(10), chr(10) + '    ')},")
    lines += [")", "print(job.id, job.status)"]
    return "\n".join(lines) + "\n"
