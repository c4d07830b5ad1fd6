"""The training process: `python -m worker.train JOB_JSON`, started by the worker's runner.

It loads the model and data, trains with TRL (GRPO, SFT or DPO; LoRA by default), and reports
structured events (running, step, metrics, checkpoint saved, error) as JSON lines on the file
descriptor in VERI_EVENTS_FD; its stdout and stderr are the job's log. Any failure ends with one
`error` event carrying a catalog code, and exit status 1.
"""

import faulthandler
import json
import logging
import math
import os
import re
import shutil
import signal
import sys
import threading
import time
import traceback
import warnings
from pathlib import Path

from worker import formats, graders
from worker.errors import TRAINING_CODES, JobFailure
from worker.rows import row_problem


class Events:
    def __init__(self):
        fd = os.environ.get("VERI_EVENTS_FD")
        self.stream = os.fdopen(int(fd), "w", buffering=1) if fd else None

    def emit(self, kind: str, **data) -> None:
        if self.stream:
            self.stream.write(json.dumps({"event": kind, **data}) + "\n")
            self.stream.flush()


SAMPLES_PER_STEP = 4
SAMPLE_CHARS = 2000


def as_text(value) -> str:
    """A prompt or completion as text: a message list shows its last message's content."""
    if isinstance(value, list) and value and isinstance(value[-1], dict):
        return str(value[-1].get("content", ""))
    return value if isinstance(value, str) else json.dumps(value, default=str)


class SampleRecorder:
    """Every `every` steps, the first few completions of a step with each reward function's
    score and their total: what the Samples tab shows. The reward functions are called one
    after another on the same completions; the sample is sent once all have scored them."""

    def __init__(self, events: Events, every: int):
        self.events, self.every = events, max(1, every)
        self.names: list[str] = []  # set by load_rewards
        self.step, self.scores, self.sent = 0, {}, set()

    def record(self, name: str, prompts, completions, scores: list[float]) -> None:
        if self.step % self.every or self.step in self.sent:
            return
        self.scores[name] = scores
        if set(self.scores) != set(self.names):
            return
        samples = []
        for index in range(min(SAMPLES_PER_STEP, len(completions))):
            rewards = {n: self.scores[n][index] for n in self.names}
            samples.append(
                {
                    "index": index,
                    "prompt": as_text(prompts[index])[:SAMPLE_CHARS],
                    "completion": as_text(completions[index])[:SAMPLE_CHARS],
                    "reward": sum(rewards.values()),
                    "rewards": rewards,
                }
            )
        self.events.emit("samples", step=self.step, samples=samples)
        self.sent.add(self.step)
        self.scores = {}


def load_rewards(source: str, recorder: SampleRecorder | None = None) -> list:
    """The customer's reward functions: every one marked with @reward_function (or
    @training_job), else `reward(...)`. TRL adds their scores; each is logged on its own."""
    namespace = {"__name__": "veri_reward"}
    try:
        exec(compile(source, "reward.py", "exec"), namespace)  # customer code, on the worker only
    except ImportError as exc:
        raise JobFailure(
            "dependency_error", f"the reward source imports a missing package: {exc}"
        ) from exc
    functions = graders.reward_functions(namespace)
    if not functions:
        raise JobFailure("config_error", "reward_source defines no `reward` function")
    names = [getattr(f, "__name__", "reward") for f in functions]
    if recorder:
        recorder.names = names
    return [_scored(f, name, recorder) for f, name in zip(functions, names, strict=True)]


def _scored(function, name: str, recorder: SampleRecorder | None):
    def reward_func(prompts, completions, **kwargs):
        try:
            scores = [
                float(score)
                for score in function(prompts=prompts, completions=completions, **kwargs)
            ]
        except BaseException as exc:  # noqa: BLE001 - SystemExit too: whatever it raises is its error
            traceback.print_exc()
            raise JobFailure(
                "training_error", f"the reward function raised {type(exc).__name__}: {exc}"
            ) from None
        if recorder:
            recorder.record(name, prompts, completions, scores)
        return scores

    reward_func.__name__ = name
    return reward_func


def load_rows(spec: dict, key: str = "dataset") -> list[dict]:
    """The rows of the job's `dataset` (or `validation_dataset`), each checked for its method."""
    data, what = spec[key], "the dataset" if key == "dataset" else "the validation dataset"
    if data["source"] == "hf":
        from datasets import load_dataset

        # `datasets` would read a local folder of that name, or local files with `json`, `csv`…
        if os.path.exists(data["repo"]) or "/" not in data["repo"]:
            raise JobFailure("config_error", f"{data['repo']!r} is not an owner/name dataset id")
        try:
            loaded = load_dataset(data["repo"], split=data["split"], revision=data["revision"])
        except Exception as exc:
            raise JobFailure("training_error", f"could not load {data['repo']}: {exc}") from exc
        return [dict(row) for row in loaded]
    rows = []
    with open(data["local_path"], encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except (ValueError, RecursionError) as exc:
                raise JobFailure(
                    "invalid_dataset", f"{what}'s line {number} is not valid JSON ({exc})"
                ) from exc
            if problem := row_problem(spec["method"], row):
                raise JobFailure("invalid_dataset", f"{what}'s line {number} {problem}")
            rows.append(row)
    if not rows:
        raise JobFailure("invalid_dataset", f"{what} has no rows")
    return rows


def trainer_dataset(method: str, rows: list[dict], tokenizer, max_length: int | None):
    """The rows as the method's TRL trainer takes them (worker.formats)."""
    from datasets import Dataset

    if method == "sft_text":
        from jinja2 import TemplateError

        examples = []
        for number, row in enumerate(rows, start=1):
            try:
                examples.append(formats.supervised_example(row, tokenizer, max_length))
            except TemplateError as exc:  # the template's own check (roles must alternate…)
                raise JobFailure(
                    "invalid_dataset", f"row {number}: the model's chat template refuses it: {exc}"
                ) from exc
            except ValueError as exc:  # transformers: the tokenizer has no chat template
                raise JobFailure(
                    "config_error", f"chat rows need the model's chat template, and: {exc}"
                ) from exc
    elif method == "dpo":
        examples = [formats.preference_row(r) for r in rows]
    else:
        examples = [formats.reinforcement_row(r) for r in rows]
    try:
        return Dataset.from_list(examples)
    except (ValueError, TypeError) as exc:  # pyarrow: a column is a number here, text there…
        raise JobFailure(
            "invalid_dataset", f"the rows' fields must have one type each across rows: {exc}"
        ) from exc


def duration(seconds: float) -> str:
    """`42s`, `3m05s`, `2h04m`: short enough for a progress line."""
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


SHOWN = (
    ("loss", "loss"),
    ("eval_loss", "eval_loss"),
    ("reward", "reward"),
    ("kl", "kl"),
    ("learning_rate", "lr"),
)


def progress_line(step: int, max_steps: int, values: dict, seconds_per_step: float | None) -> str:
    """One readable line per step, e.g. `step 12/60  loss 0.41  reward 0.37  3.1 s/step  eta
    2m29s`; every value still goes to /metrics."""
    parts = [f"step {step}/{max_steps}" if max_steps > 0 else f"step {step}"]
    parts += [f"{label} {values[key]:.4g}" for key, label in SHOWN if key in values]
    if seconds_per_step:
        parts.append(f"{seconds_per_step:.2g} s/step")
        if max_steps > step:
            parts.append(f"eta {duration((max_steps - step) * seconds_per_step)}")
    return "  ".join(parts)


def set_adapter_base(folder: Path, spec: dict) -> None:
    """Name the base model in a saved adapter (its config and model card) as the customer named
    it (a hub id, or `volume://…`), not as the worker's temporary mount path."""
    config = folder / "adapter_config.json"
    if config.is_file():
        values = json.loads(config.read_text())
        values["base_model_name_or_path"] = spec["base_model"]
        config.write_text(json.dumps(values, indent=2, sort_keys=True) + "\n")
    card = folder / "README.md"
    if card.is_file() and spec["model_path"] != spec["base_model"]:
        card.write_text(card.read_text().replace(spec["model_path"], spec["base_model"]))


STOP_ASKED = threading.Event()  # SIGUSR1 from the runner: save a checkpoint and stop
SAVE_ASKED = threading.Event()  # SIGUSR2: the machine is going away, save a checkpoint now


def agreed(*flags: bool) -> list[bool]:
    """Each flag as set on any rank, for every rank: the runner's signals reach the ranks at
    slightly different steps, and a save or a stop must happen at the same step on all of them
    (a save alone on one rank would leave the others waiting in a collective)."""
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return list(flags)
    device = f"cuda:{torch.cuda.current_device()}" if dist.get_backend() == "nccl" else "cpu"
    votes = torch.tensor([float(flag) for flag in flags], device=device)
    dist.all_reduce(votes, op=dist.ReduceOp.MAX)
    return [bool(vote) for vote in votes.tolist()]


def make_callback(events: Events, spec: dict, recorder: SampleRecorder | None = None):
    from transformers import TrainerCallback

    class VeriCallback(TrainerCallback):
        """Per-step metrics and a readable progress line, the step for heartbeats, and each
        saved checkpoint."""

        def __init__(self):
            self.last_tokens, self.last_time = None, time.monotonic()
            self.started, self.first_step = time.monotonic(), None
            self.flushing = False  # the next save is the one a preemption notice asked for
            self.held: dict = {}  # a step's training values, while its evaluation runs

        def on_train_begin(self, args, state, control, **kwargs):
            self.started, self.first_step = time.monotonic(), state.global_step
            events.emit("running", step=state.global_step)

        def on_step_begin(self, args, state, control, **kwargs):
            if recorder:
                recorder.step = state.global_step + 1  # rewards are scored for this step

        def on_step_end(self, args, state, control, **kwargs):
            events.emit("step", step=state.global_step)
            stop, save = agreed(STOP_ASKED.is_set(), SAVE_ASKED.is_set())
            if stop and not control.should_training_stop:
                control.should_save = bool(spec.get("checkpoint_every"))
                control.should_training_stop = True
            if save:  # saved whatever checkpoint_every says: it keeps the progress
                SAVE_ASKED.clear()
                control.should_save = self.flushing = True
            if control.should_save:
                events.emit("saving", step=state.global_step)

        def seconds_per_step(self, step: int) -> float | None:
            done = step - (self.first_step or 0)
            return (time.monotonic() - self.started) / done if done > 0 else None

        def on_log(self, args, state, control, logs=None, **kwargs):
            values = {
                k: float(v)
                for k, v in (logs or {}).items()
                if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
            }
            tokens = values.get("num_tokens")
            now = time.monotonic()
            if tokens is not None and self.last_tokens is not None and now > self.last_time:
                values["tokens_per_second"] = (tokens - self.last_tokens) / (now - self.last_time)
            if tokens is not None:
                self.last_tokens, self.last_time = tokens, now
            # The control plane keeps one point per step: a step that is evaluated reports its
            # training values with its eval_* values, in one point, once the evaluation logged.
            if control.should_evaluate and not any(k.startswith("eval_") for k in values):
                self.held = values
                return
            values, self.held = self.held | values, {}
            if "train_runtime" in values:  # the trainer's summary at the end
                # A resumed run starts at its checkpoint's step: it trained only the steps after.
                first = self.first_step or 0
                resumed = f" (resumed at step {first})" if first else ""
                print(
                    f"[veri] trained {state.global_step - first} steps in "
                    f"{duration(values['train_runtime'])}{resumed}",
                    flush=True,
                )
            elif values:
                step = state.global_step
                line = progress_line(step, state.max_steps, values, self.seconds_per_step(step))
                print(line, flush=True)
            if values:
                events.emit("metrics", step=state.global_step, values=values)

        def on_save(self, args, state, control, **kwargs):
            if not state.is_world_process_zero:
                return
            folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
            set_adapter_base(folder, spec)
            # The trainer deletes old checkpoints (save_total_limit) while the runner may still be
            # uploading them: the runner gets hard links of its own, which outlive the deletion.
            outbox = Path(args.output_dir).parent / "outbox" / folder.name
            shutil.rmtree(outbox, ignore_errors=True)
            shutil.copytree(folder, outbox, copy_function=link_or_copy)
            events.emit("checkpoint", step=state.global_step, path=str(outbox), flush=self.flushing)
            self.flushing = False

    return VeriCallback()


def link_or_copy(source: str, target: str) -> None:
    try:
        os.link(source, target)
    except OSError:  # a file system without hard links
        shutil.copy2(source, target)


ALL_LINEAR = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def load_model(spec: dict, lora: dict, cuda: bool):
    """The model, its tokenizer, and the LoRA config the trainer applies (None when the model
    already carries its adapter, as Unsloth's does). QLoRA loads the base in 4 bits."""
    import torch

    if (lora.get("quantization") or lora.get("unsloth")) and not cuda:
        raise JobFailure("config_error", "QLoRA and Unsloth need a CUDA GPU; this machine has none")
    four_bit = lora.get("quantization") == "4bit"
    if lora.get("unsloth"):
        try:
            from unsloth import FastLanguageModel
        except ImportError as exc:
            raise JobFailure(
                "dependency_error", f"Unsloth is not installed on this worker ({exc})"
            ) from exc
        model, tokenizer = FastLanguageModel.from_pretrained(
            model_name=spec["model_path"],
            load_in_4bit=four_bit,
            max_seq_length=spec["hyperparameters"].get("max_seq_length", 2048),
        )
        targets = lora["target_modules"]
        model = FastLanguageModel.get_peft_model(
            model,
            r=lora["r"],
            lora_alpha=lora["alpha"],
            lora_dropout=lora["dropout"],
            target_modules=ALL_LINEAR if targets == "all-linear" else targets,
        )
        return model, tokenizer, None
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model_kwargs = {}
    if four_bit:
        from transformers import BitsAndBytesConfig

        model_kwargs["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.bfloat16
        )
    tokenizer = AutoTokenizer.from_pretrained(spec["model_path"])
    model = AutoModelForCausalLM.from_pretrained(spec["model_path"], **model_kwargs)
    if spec.get("adapter_path"):  # a fine-tuned model trains on: its adapter, its LoRA shape
        from peft import PeftModel

        return (
            PeftModel.from_pretrained(model, spec["adapter_path"], is_trainable=True),
            tokenizer,
            None,
        )
    peft_config = LoraConfig(
        r=lora["r"],
        lora_alpha=lora["alpha"],
        lora_dropout=lora["dropout"],
        task_type="CAUSAL_LM",
        target_modules=lora["target_modules"],
    )
    return model, tokenizer, peft_config


def resumable_grpo(grpo_trainer: type) -> type:
    """GRPOTrainer whose prompt order is a function of (seed, epoch). TRL's RepeatSampler draws
    each epoch's order from one generator seeded once, so the order depends on how many epochs
    this process has iterated: a run resumed in its second epoch would see the first epoch's
    prompts again and train differently from the run it continues. The trainer tells the
    sampler its epoch (`set_epoch`) whether it resumed or not."""
    from trl.trainer.utils import RepeatSampler

    class EpochSeededRepeatSampler(RepeatSampler):
        epoch = 0

        def set_epoch(self, epoch: int) -> None:
            self.epoch = epoch

        def __iter__(self):
            if self.shuffle and self.seed is not None:
                self.generator.manual_seed(self.seed + self.epoch)
            return super().__iter__()

    class ResumableGRPOTrainer(grpo_trainer):
        def _get_train_sampler(self, dataset=None):
            stock = super()._get_train_sampler(dataset)
            return EpochSeededRepeatSampler(
                data_source=stock.data_source,
                mini_repeat_count=stock.mini_repeat_count,
                batch_size=stock.batch_size,
                repeat_count=stock.repeat_count,
                shuffle=stock.shuffle,
                seed=stock.seed,
            )

    return ResumableGRPOTrainer


def build_trainer(
    spec: dict, rows: list[dict], events: Events, eval_rows: list[dict] | None = None
):
    """The method's TRL trainer; with `eval_rows` (the validation dataset), it evaluates every
    `eval_interval` steps (default: at each checkpoint, else every tenth of the steps)."""
    import torch
    from transformers import PrinterCallback

    hp, lora, method = spec["hyperparameters"], spec["lora"], spec["method"]
    cuda = torch.cuda.is_available() and spec["gpu_type"] != "cpu"
    model, tokenizer, peft_config = load_model(spec, lora, cuda)
    events.emit("loaded")  # the job's `timings`: model loaded
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    # batch_size is the global batch: across the devices, and accumulated to.
    world = int(os.environ.get("WORLD_SIZE", 1))
    batch = hp["batch_size"]
    micro = hp.get("micro_batch_size") or max(1, batch // world)
    common = {
        "output_dir": spec["output_dir"],
        "learning_rate": hp["learning_rate"],
        "per_device_train_batch_size": micro,
        "gradient_accumulation_steps": hp.get("gradient_accumulation_steps")
        or max(1, batch // (micro * world)),
        "warmup_steps": hp.get("warmup_ratio", 0.0),  # a float below 1 is a ratio of all steps
        "weight_decay": hp.get("weight_decay", 0.0),
        "lr_scheduler_type": hp.get("lr_scheduler", "linear"),
        "seed": hp.get("seed", 42),
        "logging_steps": 1,
        "report_to": "none",
        "use_cpu": not cuda,
        "bf16": cuda and torch.cuda.is_bf16_supported(),
        "gradient_checkpointing": False,
        "save_strategy": "steps" if spec.get("checkpoint_every") else "no",
        "save_steps": spec.get("checkpoint_every") or 500,
        "save_total_limit": spec["checkpoint_keep"] + 1,
        "disable_tqdm": True,
    }
    if "max_steps" in hp:
        common["max_steps"] = hp["max_steps"]
    if "epochs" in hp:
        common["num_train_epochs"] = hp["epochs"]
    max_length = hp.get("max_seq_length")
    dataset = trainer_dataset(method, rows, tokenizer, max_length)
    eval_dataset = None
    if eval_rows:
        eval_rows = eval_rows[: hp.get("eval_samples") or len(eval_rows)]
        eval_dataset = trainer_dataset(method, eval_rows, tokenizer, max_length)
        common |= {
            "eval_strategy": "steps",
            # A float below 1 is a share of all steps, which the trainer works out.
            "eval_steps": hp.get("eval_interval") or spec.get("checkpoint_every") or 0.1,
            "per_device_eval_batch_size": micro,
        }
    recorder = None
    try:
        if method == "grpo":
            from trl import GRPOConfig, GRPOTrainer

            config = GRPOConfig(
                **common,
                num_generations=hp["rollouts_per_prompt"],
                max_completion_length=hp["max_response_length"],
                beta=hp["kl_coef"],
                temperature=hp["temperature"],
            )
            recorder = SampleRecorder(events, spec.get("samples_every") or 10)
            trainer = resumable_grpo(GRPOTrainer)(
                model=model,
                reward_funcs=load_rewards(spec["reward_source"], recorder),
                args=config,
                train_dataset=dataset,
                eval_dataset=eval_dataset,
                processing_class=tokenizer,
                peft_config=peft_config,
            )
        elif method == "sft_text":
            from trl import SFTConfig, SFTTrainer

            config = SFTConfig(**common, max_length=hp["max_seq_length"])
            trainer = SFTTrainer(
                model=model,
                args=config,
                train_dataset=dataset,
                eval_dataset=eval_dataset,
                processing_class=tokenizer,
                peft_config=peft_config,
            )
        else:
            from trl import DPOConfig, DPOTrainer

            config = DPOConfig(**common, beta=hp["beta"], max_length=hp["max_seq_length"])
            trainer = DPOTrainer(
                model=model,
                args=config,
                train_dataset=dataset,
                eval_dataset=eval_dataset,
                processing_class=tokenizer,
                peft_config=peft_config,
            )
    except (ValueError, TypeError) as exc:
        traceback.print_exc()
        raise JobFailure("config_error", f"the trainer refused this configuration: {exc}") from exc
    trainer.remove_callback(PrinterCallback)  # raw dicts; the progress line replaces them
    trainer.add_callback(make_callback(events, spec, recorder))
    return trainer, tokenizer


# What torch.distributed raises when a peer is gone or a collective cannot complete.
DISTRIBUTED_FAULT = re.compile(
    r"nccl|gloo|ProcessGroup|Connection closed by peer|Connection reset by peer|"
    r"collective operation timeout|rendezvous|DistBackendError",
    re.IGNORECASE,
)


def classify(exc: BaseException) -> tuple[str, str]:
    """The catalog code for an exception raised while loading or training."""
    if isinstance(exc, JobFailure) and exc.code in TRAINING_CODES:
        return exc.code, exc.message
    text = f"{type(exc).__name__}: {exc}"
    if int(os.environ.get("WORLD_SIZE", 1)) > 1 and DISTRIBUTED_FAULT.search(text):
        return "distributed_error", f"the devices stopped talking to each other ({text})"[:2000]
    if "OutOfMemoryError" in type(exc).__name__ or "out of memory" in str(exc).lower():
        return "oom", f"the GPU ran out of memory ({text})"
    if isinstance(exc, ImportError):
        return "dependency_error", f"a package is missing: {text}"
    return "training_error", text


def quiet_library_notices() -> None:
    """The libraries' notices meant for their callers (TRL using transformers' renamed APIs;
    transformers telling a local disk's checkpoint times apart) are Veri's to act on, not the
    customer's: they stay out of the job's log. Their errors and the customer's own warnings do
    not."""
    warnings.filterwarnings("ignore", category=FutureWarning, module=r"(transformers|trl|peft)\.")
    logging.getLogger("transformers.trainer_utils").setLevel(logging.ERROR)


def main() -> int:
    # No W&B here: the runner reports the job's metrics (it alone holds the key), and TRL imports
    # wandb whenever it is installed, half a second of CPU at every rank's start for nothing.
    sys.modules["wandb"] = None
    quiet_library_notices()
    signal.signal(signal.SIGUSR1, lambda *_: STOP_ASKED.set())
    signal.signal(signal.SIGUSR2, lambda *_: SAVE_ASKED.set())
    # A stalled multi-GPU training is ended with SIGQUIT: each rank's stack goes to its log.
    faulthandler.register(signal.SIGQUIT, all_threads=True)
    events = Events()
    spec = json.loads(Path(sys.argv[1]).read_text())
    try:
        rows = load_rows(spec)
        eval_rows = (
            load_rows(spec, "validation_dataset") if spec.get("validation_dataset") else None
        )
        if eval_rows:
            print(f"[veri] {len(eval_rows)} validation rows", flush=True)
        print(f"[veri] {len(rows)} rows; loading {spec['base_model']}", flush=True)
        trainer, tokenizer = build_trainer(spec, rows, events, eval_rows)
        trainer.train(resume_from_checkpoint=spec.get("resume_path"))
        if STOP_ASKED.is_set():
            print(f"[veri] stopped at step {trainer.state.global_step}, as asked", flush=True)
            events.emit("stopped", step=trainer.state.global_step)
            return 0
        final = Path(spec["final_dir"])
        trainer.save_model(str(final))
        tokenizer.save_pretrained(str(final))
        set_adapter_base(final, spec)
        print(f"[veri] training finished at step {trainer.state.global_step}", flush=True)
        events.emit("finished", step=trainer.state.global_step, path=str(final))
        return 0
    except BaseException as exc:  # noqa: BLE001 - every failure is reported with its code
        if not isinstance(exc, JobFailure):
            traceback.print_exc()
        code, message = classify(exc)
        events.emit("error", code=code, message=message)  # the runner logs it, once
        return 1


if __name__ == "__main__":
    status = main()
    # Without the interpreter's teardown (freeing the model, libraries' exit hooks): it takes a
    # second or more once the model is saved, and the runner uploads it when this process ends.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
