"""A GRPO job through Veri against the same TRL training in a plain script (same tiny model made
here, data, config, LoRA and seed as the worker's), measured the same way on both sides:

- wall time: from the training process's start (its /proc start time: `python -c` for the plain
  script, `worker.train` under the Veri worker) to the final adapter saved (written by the plain
  script; in the job's store for Veri: its final checkpoint recorded);
- steps/s: from the trainer's per-step log timestamps (`on_log`, every step), over the same steps,
  after the same warm-up steps;
- and, apart, what the platform adds before the first step: queued → launched → worker
  registered → volumes synced → model loaded → first step (the job's `timings`).

    .venv/bin/python -m bench.worker_overhead [--steps 150] [--warmup 10] [--repeat 3]

The two sides take turns, --repeat times, on one embedded platform (SQLite, local store, local
provider); prints each run, the median ratios with their spread, and the goals.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path

from bench.common import embedded_env, embedded_platform, free_port, new_workspace, tiny_model

REWARD = (
    "def reward(completions, **kwargs):\n"
    "    return [c.count('a') / max(len(c), 1) for c in completions]\n"
)
ROWS = [{"prompt": f"Tell me about {w}"} for w in ("cats", "rain", "trains", "music")] * 8
HYPER = {
    "learning_rate": 1e-2,
    "batch_size": 16,
    "rollouts_per_prompt": 8,
    "max_response_length": 16,
    "kl_coef": 0.0,
    "temperature": 1.0,
    "seed": 42,
    "lr_scheduler": "constant",
}
LORA = {
    "r": 8,
    "alpha": 16,
    "dropout": 0.0,
    "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"],
}

# The worker's trainer (worker/train.py `build_trainer`) with the job's settings above: the same
# GRPOConfig, LoRA, tokenizer padding and seed; its one callback stamps each logged step.
PLAIN = """
import json, sys, time
from datasets import Dataset
from peft import LoraConfig
from transformers import AutoModelForCausalLM, AutoTokenizer, PrinterCallback, TrainerCallback
from trl import GRPOConfig, GRPOTrainer
model_dir, data_file, out, steps = sys.argv[1:5]
namespace = {}
exec(open(data_file + ".reward.py").read(), namespace)
reward = namespace["reward"]
def reward_func(prompts, completions, **kw):
    return [float(x) for x in reward(prompts=prompts, completions=completions, **kw)]
reward_func.__name__ = "reward"
rows = [json.loads(line) for line in open(data_file)]
tokenizer = AutoTokenizer.from_pretrained(model_dir)
model = AutoModelForCausalLM.from_pretrained(model_dir)
if tokenizer.pad_token is None:
    tokenizer.pad_token = tokenizer.eos_token
config = GRPOConfig(output_dir=out + "/output", learning_rate=1e-2, max_steps=int(steps),
    per_device_train_batch_size=16, gradient_accumulation_steps=1, warmup_steps=0.0,
    weight_decay=0.0, lr_scheduler_type="constant", seed=42, logging_steps=1, report_to="none",
    use_cpu=True, bf16=False, gradient_checkpointing=False, save_strategy="no", save_steps=500,
    save_total_limit=3, disable_tqdm=True, num_generations=8, max_completion_length=16,
    beta=0.0, temperature=1.0)
lora = LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, task_type="CAUSAL_LM",
    target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])
stamps = {}
class Stamp(TrainerCallback):
    def on_log(self, args, state, control, logs=None, **kwargs):
        stamps[state.global_step] = time.time()
trainer = GRPOTrainer(model=model, reward_funcs=[reward_func], args=config,
    train_dataset=Dataset.from_list(rows), processing_class=tokenizer, peft_config=lora)
trainer.remove_callback(PrinterCallback)
trainer.add_callback(Stamp())
trainer.train()
trainer.save_model(out + "/final")
tokenizer.save_pretrained(out + "/final")
print("RESULT", json.dumps({"saved": time.time(), "stamps": stamps}))
"""

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def process_start(pid: int) -> float:
    """When process `pid` started (epoch seconds, to a clock tick), from /proc: its start in
    ticks since boot, against the clock since boot now (btime is whole seconds, and drifts)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    since_boot = time.clock_gettime(time.CLOCK_BOOTTIME)
    return time.time() - (since_boot - int(fields[19]) / CLOCK_TICKS)


def steps_per_second(stamps: dict[int, float], warmup: int, steps: int) -> float:
    """Steps after the warm-up ones, over the time between their log timestamps."""
    return (steps - warmup) / (stamps[steps] - stamps[warmup])


def run_plain(env: dict, model: Path, data: Path, out: Path, steps: int, warmup: int) -> dict:
    process = subprocess.Popen(
        [sys.executable, "-c", PLAIN, str(model), str(data), str(out), str(steps)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    started = process_start(process.pid)
    output, _ = process.communicate()
    if process.returncode:
        raise SystemExit(f"the plain script failed ({process.returncode})")
    result = json.loads(output.split("RESULT ", 1)[1])
    stamps = {int(step): at for step, at in result["stamps"].items()}
    return {
        "wall": result["saved"] - started,
        "steps_per_second": steps_per_second(stamps, warmup, steps),
    }


class TrainingStartWatch(threading.Thread):
    """Notes the start time of job `job_id`'s training process (`worker.train` on its job file,
    which the local provider keeps in a folder named after the job), once it appears."""

    def __init__(self, job_id: str):
        super().__init__(daemon=True)
        self.job_id = job_id.encode()
        self.started: float | None = None
        self.done = threading.Event()

    def run(self) -> None:
        while self.started is None and not self.done.is_set():
            for entry in Path("/proc").iterdir():
                if not entry.name.isdigit():
                    continue
                try:
                    argv = (entry / "cmdline").read_bytes().split(b"\0")
                    if b"worker.train" in argv and self.job_id in argv[-2]:
                        self.started = process_start(int(entry.name))
                        return
                except OSError:
                    continue
            time.sleep(0.05)


def _when(value: str) -> float:
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def run_veri(client, dataset_id: str, steps: int, warmup: int) -> dict:
    job = client.training_jobs.create(
        base_model="volume://models/tiny",
        dataset_id=dataset_id,
        method="grpo",
        reward_source=REWARD,
        gpu_type="cpu",
        lora=LORA,
        hyperparameters={**HYPER, "max_steps": steps},
    )
    watch = TrainingStartWatch(job.id)
    watch.start()
    # The times come from the job's own records, not from this wait: it asks seldom, so that
    # answering it takes no CPU from the training (the plain side has no such poller).
    job = client.training_jobs.wait(job.id, poll_interval=5.0, stream=False)
    watch.done.set()
    if job.status != "completed":
        raise SystemExit(f"the Veri job ended {job.status}: {job.error}")
    stamps = {p["step"]: _when(p["at"]) for p in client.training_jobs.metrics(job.id)}
    [final] = [c for c in client.training_jobs.checkpoints(job.id) if c["final"]]
    timings = job.data["timings"]
    phases = ["queued", "launched", "registered", "volumes_synced", "model_loaded", "first_step"]
    at = [_when(timings[f"{p}_at"]) for p in phases]
    return {
        "wall": _when(final["created_at"]) - watch.started,
        "steps_per_second": steps_per_second(stamps, warmup, steps),
        "before_first_step": {
            f"{phases[i - 1]} -> {phases[i]}": at[i] - at[i - 1] for i in range(1, len(phases))
        },
        "spawn_after_registered": watch.started - at[2],
    }


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.3f} (min {min(values):.3f}, max {max(values):.3f})"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--warmup", type=int, default=10, help="steps left out of steps/s")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each side, taking turns")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="veri-overhead-"))
    port = free_port()
    api_url = f"http://127.0.0.1:{port}"
    env = embedded_env(work, port)
    key = new_workspace(env, "bench", "--credit", "1000")
    model = tiny_model(env, work / "tiny")
    data = work / "data.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    Path(f"{data}.reward.py").write_text(REWARD)

    plain_runs, veri_runs = [], []
    with embedded_platform(env, port):
        from veri_sdk import Client

        client = Client(api_key=key, base_url=api_url)
        client.volumes.create("models")
        client.volumes.upload_dir("models", model, prefix="tiny")
        dataset = client.datasets.upload(data)
        # Untimed: the first run of either would pay for a cold page cache.
        run_plain(env, model, data, work / "warm", args.warmup + 2, args.warmup)
        for run in range(args.repeat):
            # Turns, the plain script first each time: both see the machine alike.
            out = work / f"plain-{run}"
            plain_runs.append(run_plain(env, model, data, out, args.steps, args.warmup))
            veri_runs.append(run_veri(client, dataset.id, args.steps, args.warmup))
            p, v = plain_runs[-1], veri_runs[-1]
            print(
                f"run {run + 1}: plain {p['wall']:6.2f} s {p['steps_per_second']:.3f} steps/s | "
                f"veri {v['wall']:6.2f} s {v['steps_per_second']:.3f} steps/s",
                flush=True,
            )

    walls = [v["wall"] / p["wall"] for p, v in zip(plain_runs, veri_runs, strict=True)]
    rates = [
        v["steps_per_second"] / p["steps_per_second"]
        for p, v in zip(plain_runs, veri_runs, strict=True)
    ]
    print(
        f"\nGRPO, {args.steps} steps (steps/s over steps {args.warmup}-{args.steps}), tiny Qwen2 "
        f"+ LoRA, CPU, {args.repeat} runs each"
    )
    print("  wall: training process start -> final adapter saved")
    print(f"    plain TRL  {spread([p['wall'] for p in plain_runs])} s")
    print(f"    Veri job   {spread([v['wall'] for v in veri_runs])} s")
    print(f"    ratio veri/plain: {spread(walls)}  (goal <= 1.05)")
    print("  steps/s from the trainer's per-step log times")
    print(f"    plain TRL  {spread([p['steps_per_second'] for p in plain_runs])}")
    print(f"    Veri job   {spread([v['steps_per_second'] for v in veri_runs])}")
    print(f"    ratio veri/plain: {spread(rates)}  (goal >= 0.97)")
    print("  what the platform adds before the first step (median seconds; not in the wall):")
    for name in veri_runs[0]["before_first_step"]:
        seconds = statistics.median(v["before_first_step"][name] for v in veri_runs)
        print(f"    {name:28s} {seconds:6.2f}")
    spawn = statistics.median(v["spawn_after_registered"] for v in veri_runs)
    print(f"    (the training process started {spawn:.2f} s after the worker registered)")


if __name__ == "__main__":
    main()
