"""`veri train FILE.py`, `veri run CONFIG.toml`, `veri rewards test FILE.py`, `veri jobs quote`.

A job is described once, either by a `@training_job(...)` reward in a Python file or by a TOML
file with `kind = "train"`; both become the same submit call. Before a GRPO job rents anything,
its reward runs here, in a child process with a time limit, on the dataset's prompts."""

import json
import runpy
import subprocess
import sys
import tomllib
from pathlib import Path

from veri_sdk.cli.jobs import detached, failed, show_quote
from veri_sdk.cli.output import err, out, print_table, table
from veri_sdk.rewards import JOB_ATTRIBUTE
from veri_sdk.training import Dataset

CHECK_TIMEOUT_SECONDS = 60


class BadConfig(Exception):
    """A job description that cannot be submitted as written: exit 2, naming the key."""


# Each key a TOML job takes, with the types it may have (tomllib's: str, int, float, bool, list,
# dict). `reward` is a Python file, relative to the TOML; `dataset` and `validation_dataset` as
# in @training_job.
TOML_KEYS: dict[str, tuple[type, ...]] = {
    "kind": (str,),
    "base_model": (str,),
    "dataset": (str,),
    "validation_dataset": (str,),
    "method": (str,),
    "reward": (str,),
    "output_name": (str,),
    "hyperparameters": (dict,),
    "lora": (dict,),
    "gpu_type": (str,),
    "gpu_count": (int,),
    "provider": (str,),
    "region": (str,),
    "volumes": (list,),
    "resume_from": (str,),
    "adapter_from": (str,),
    "checkpoint_every": (int,),
    "checkpoint_keep": (int,),
    "heartbeat_timeout_seconds": (int,),
    "max_launch_attempts": (int,),
    "auto_resume": (bool,),
    "max_restarts": (int,),
    "max_cost_usd": (int, float, str),
    "integrations": (list,),  # [[integrations]] type = "wandb", with [integrations.wandb]
}
REQUIRED = ("kind", "base_model", "dataset")
TYPE_NAMES = {
    str: "a string",
    int: "a whole number",
    float: "a number",
    dict: "a table",
    list: "an array",
    bool: "true or false",
}


def _line_of(text: str, key: str) -> str:
    for number, line in enumerate(text.splitlines(), start=1):
        if line.strip().startswith((f"{key} ", f"{key}=", f"[{key}]")):
            return f" (line {number})"
    return ""


def load_toml(path: Path) -> dict:
    """The job a TOML file describes, as `{fields, dataset, reward_file}`; `BadConfig` names the
    first key that is unknown, missing, or of the wrong type."""
    text = path.read_text(encoding="utf-8")
    try:
        config = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise BadConfig(f"{path}: {exc}") from None
    for key, value in config.items():
        if key not in TOML_KEYS:
            raise BadConfig(
                f"{path}: unknown key {key!r}{_line_of(text, key)}; known keys: "
                f"{', '.join(TOML_KEYS)}."
            )
        types = TOML_KEYS[key]
        # bool is an int to Python, but `true` is no step count
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            wanted = " or ".join(TYPE_NAMES[t] for t in types)
            raise BadConfig(
                f"{path}: {key!r} must be {wanted}, not {type(value).__name__} "
                f"{value!r:.60}{_line_of(text, key)}."
            )
    for key in REQUIRED:
        if key not in config:
            raise BadConfig(f"{path}: {key!r} is missing; a job needs {', '.join(REQUIRED)}.")
    if config["kind"] != "train":
        raise BadConfig(f'{path}: kind must be "train"{_line_of(text, "kind")}.')
    fields = {
        k: v
        for k, v in config.items()
        if k not in {"kind", "dataset", "validation_dataset", "reward"}
    }
    reward_file = None
    if "reward" in config:
        reward_file = (path.parent / config["reward"]).resolve()
        if not reward_file.is_file():
            raise BadConfig(f"{path}: reward file {reward_file} does not exist.")
        fields["reward_source"] = reward_file.read_text(encoding="utf-8")
    validation = config.get("validation_dataset")
    return {
        "fields": fields,
        "dataset": _relative(config["dataset"], path.parent),
        "validation_dataset": validation and _relative(validation, path.parent),
        "reward_file": reward_file,
    }


def load_decorated(path: Path) -> dict:
    """The job a `@training_job(...)` reward in a Python file describes; the whole module is
    the reward source (the worker runs it; here it is only imported, to read the decorator)."""
    try:
        namespace = runpy.run_path(str(path), run_name="veri_train")
    except Exception as exc:  # noqa: BLE001 - the user's module; say what broke
        raise BadConfig(f"{path} does not import: {type(exc).__name__}: {exc}") from None
    marked = [v for v in namespace.values() if callable(v) and hasattr(v, JOB_ATTRIBUTE)]
    if len(marked) != 1:
        raise BadConfig(
            f"{path} must define exactly one function decorated with @training_job(...); "
            f"found {len(marked)}."
        )
    config = dict(getattr(marked[0], JOB_ATTRIBUTE))
    dataset = _relative(config.pop("dataset"), path.parent)
    validation = config.pop("validation_dataset", None)
    fields = {k: v for k, v in config.items() if v is not None}
    fields["reward_source"] = path.read_text(encoding="utf-8")
    return {
        "fields": fields,
        "dataset": dataset,
        "validation_dataset": validation and _relative(validation, path.parent),
        "reward_file": path,
    }


def _relative(dataset: str, base: Path) -> str:
    """A local dataset file named relative to the job's file; ids and URLs as they are."""
    if dataset.startswith(("ds_", "volume://", "hf://")):
        return dataset
    return str((base / dataset).resolve())


def load_job(path: str) -> dict:
    file = Path(path)
    if not file.is_file():
        raise BadConfig(f"{path} does not exist.")
    return load_toml(file) if file.suffix == ".toml" else load_decorated(file)


def resolved_datasets(client, job: dict) -> dict:
    """The submit fields naming the job's datasets, each uploaded or connected first if needed."""
    ids = {"dataset_id": resolve_dataset(client, job["dataset"])}
    if job.get("validation_dataset"):
        ids["validation_dataset_id"] = resolve_dataset(client, job["validation_dataset"])
    return ids


def resolve_dataset(client, dataset: str) -> str:
    if dataset.startswith("ds_"):
        return dataset
    if dataset.startswith("volume://"):
        volume, _, path = dataset.removeprefix("volume://").partition("/")
        return Dataset.from_volume(volume, path, client=client).id
    if dataset.startswith("hf://"):
        return client.datasets.connect_hf(dataset.removeprefix("hf://")).id
    if not Path(dataset).is_file():
        raise BadConfig(f"dataset {dataset} is not a file, a ds_ id, volume:// or hf://.")
    uploaded = client.datasets.upload(dataset)
    if uploaded.created:
        out.print(f"Uploaded {dataset} as {uploaded.id} ({uploaded.row_count} rows).")
    else:
        out.print(f"Using {uploaded.id} ({uploaded.row_count} rows): the same bytes as {dataset}.")
    return uploaded.id


# The reward check


def check_reward(reward_file: Path, dataset: str | None, count: int) -> dict:
    """Run the reward in a child process (it is the user's code: a crash or a hang stays there)
    and return its report; a timeout is reported as an error."""
    command = [sys.executable, "-m", "veri_sdk.reward_check", str(reward_file), "-n", str(count)]
    if dataset and Path(dataset).is_file():
        command += ["--dataset", dataset]
    try:
        result = subprocess.run(
            command, capture_output=True, text=True, timeout=CHECK_TIMEOUT_SECONDS
        )
    except subprocess.TimeoutExpired:
        message = f"the reward did not return within {CHECK_TIMEOUT_SECONDS} s"
        return {
            "calls": [],
            "problems": [],
            "function": None,
            "error": {"type": "Timeout", "message": message, "traceback": ""},
        }
    try:
        return json.loads(result.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        detail = (result.stderr or result.stdout)[-2000:]
        return {
            "calls": [],
            "problems": [],
            "function": None,
            "error": {"type": "Crash", "message": "the check process died", "traceback": detail},
        }


def report_check(report: dict) -> bool:
    """Print what the reward did; True when a worker could use it."""
    for call in report["calls"]:
        listing = table("PROMPT", "COMPLETION", "SCORE")
        scores = call["scores"] if isinstance(call["scores"], list) else [call["scores"]]
        for prompt, completion, score in zip(
            call["prompts"], call["completions"], scores, strict=False
        ):
            listing.add_row(prompt[:60], completion[:60], str(score))
        print_table(listing)
        out.print(f"returned a {call['returned']} in {call['seconds'] * 1000:.3g} ms")
    if error := report["error"]:
        err.print(f"The reward raised {error['type']}: {error['message']}", markup=False)
        if error["traceback"]:
            err.print(error["traceback"], markup=False, highlight=False)
        return False
    for problem in report["problems"]:
        err.print(f"The reward is not usable: {problem}.", markup=False)
    if report["problems"]:
        return False
    calls = report["calls"]
    mean = sum(c["seconds"] for c in calls) / max(len(calls), 1) * 1000
    out.print(f"{report['function']} is usable: {len(calls)} call(s), {mean:.3g} ms per call.")
    return True


def cmd_rewards_test(args, client) -> int:
    report = check_reward(Path(args.file), args.dataset, args.n)
    return 0 if report_check(report) else 1


# Submitting


def _submit(args, client, job: dict) -> int:
    fields = dict(job["fields"])
    for option, key in (("region", "region"), ("gpu_type", "gpu_type"), ("provider", "provider")):
        if getattr(args, option, None):
            fields[key] = getattr(args, option)
    if fields.get("method", "grpo") == "grpo" and not args.no_check:
        if job["reward_file"] is None:
            raise BadConfig('a GRPO job needs a reward (`reward = "file.py"`).')
        out.print(f"Checking the reward in {job['reward_file']} on this machine first…")
        if not report_check(check_reward(job["reward_file"], job["dataset"], 16)):
            err.print("Not submitted: fix the reward (or pass --no-check).")
            return 1
    fields |= resolved_datasets(client, job)
    submitted = client.training_jobs.create(**fields)
    out.print(f"Submitted {submitted.id} ({submitted.status}).")
    if args.detach:
        out.print(f"Follow it with: veri jobs logs {submitted.id} -f")
        return 0
    try:
        finished = submitted.wait(poll_interval=5)
    except KeyboardInterrupt:
        return detached(submitted.id)
    if finished.status != "completed":
        return failed(finished)
    folder = finished.download("./checkpoints")
    out.print(f"{finished.id} completed at step {finished.last_step}; cost {finished.cost_usd} USD")
    out.print(f"The trained model is in {folder}/")
    return 0


def cmd_train(args, client) -> int:
    return _submit(args, client, load_job(args.file))


def cmd_run(args, client) -> int:
    return _submit(args, client, load_job(args.file))


def cmd_jobs_quote(args, client) -> int:
    job = load_job(args.file)
    fields = dict(job["fields"], **resolved_datasets(client, job))
    quote = client.training_jobs.quote(**fields)
    if args.json:
        print(json.dumps(quote, indent=2))
    else:
        show_quote(quote)
    return 0
