"""A GRPO job through Veri (worker register → completed) against the same TRL training in a plain
script, on a tiny model made here, in one run. Both pay the same imports.

    .venv/bin/python -m bench.worker_overhead [--steps 100]

Prints both wall times, both trainers' steps/s, and the ratios.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from bench.common import (
    embedded_env,
    embedded_platform,
    free_port,
    new_workspace,
    steps_per_second,
)

REPO = Path(__file__).resolve().parent.parent
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
}
LORA = {
    "r": 8,
    "alpha": 16,
    "dropout": 0.0,
    "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"],
}

PLAIN = """
import json, sys, time
from datasets import Dataset
from peft import LoraConfig
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import GRPOConfig, GRPOTrainer
model_dir, data_file, out, steps = sys.argv[1:5]
namespace = {}
exec(open(data_file + ".reward.py").read(), namespace)
reward = namespace["reward"]
def reward_func(prompts, completions, **kw):
    return [float(x) for x in reward(prompts=prompts, completions=completions, **kw)]
rows = [json.loads(line) for line in open(data_file)]
tokenizer = AutoTokenizer.from_pretrained(model_dir)
model = AutoModelForCausalLM.from_pretrained(model_dir)
config = GRPOConfig(output_dir=out, learning_rate=1e-2, max_steps=int(steps),
    per_device_train_batch_size=16, num_generations=8, max_completion_length=16, beta=0.0,
    temperature=1.0, logging_steps=1,
    report_to="none", use_cpu=True, bf16=False, gradient_checkpointing=False, save_strategy="no",
    lr_scheduler_type="constant", seed=42, disable_tqdm=True)
lora = LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, task_type="CAUSAL_LM",
    target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])
trainer = GRPOTrainer(model=model, reward_funcs=[reward_func], args=config,
    train_dataset=Dataset.from_list(rows), processing_class=tokenizer, peft_config=lora)
result = trainer.train()
trainer.save_model(out + "/final")
print("STEPS_PER_SECOND", result.metrics["train_steps_per_second"])
"""


def cpu_seconds(marker: str) -> float:
    """User + system CPU of every process whose command line contains `marker` (and their
    children's, once reaped), from /proc."""
    total, tick = 0.0, os.sysconf("SC_CLK_TCK")
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if marker not in (entry / "cmdline").read_bytes().decode(errors="replace"):
                continue
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += sum(int(v) for v in fields[11:15]) / tick  # utime, stime, cutime, cstime
    return total


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=100)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="veri-overhead-"))
    port = free_port()
    api_url = f"http://127.0.0.1:{port}"
    env = embedded_env(work, port)
    key = new_workspace(env, "bench", "--credit", "100")
    model = work / "tiny"
    subprocess.run(
        [sys.executable, "-m", "worker.tinymodel", str(model)],
        env=env,
        check=True,
        capture_output=True,
        cwd=REPO,
    )
    data = work / "data.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    Path(f"{data}.reward.py").write_text(REWARD)

    # Plain TRL first (a cold page cache would otherwise favour whichever runs second).
    started = time.perf_counter()
    plain = subprocess.run(
        [sys.executable, "-c", PLAIN, str(model), str(data), str(work / "plain"), str(args.steps)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    plain_wall = time.perf_counter() - started
    plain_sps = float(re.search(r"STEPS_PER_SECOND ([\d.]+)", plain.stdout).group(1))

    with embedded_platform(env, port):
        from veri_sdk import Client

        client = Client(api_key=key, base_url=api_url)
        client.volumes.create("models")
        client.volumes.upload_dir("models", model, prefix="tiny")
        dataset = client.datasets.upload(data)
        job = client.training_jobs.create(
            base_model="volume://models/tiny",
            dataset_id=dataset.id,
            method="grpo",
            reward_source=REWARD,
            gpu_type="cpu",
            lora=LORA,
            hyperparameters={**HYPER, "max_steps": args.steps},
        )
        control_plane_before = cpu_seconds("manage.py")
        job = client.training_jobs.wait(job.id, poll_interval=0.5, stream=False)
        control_plane_cpu = cpu_seconds("manage.py") - control_plane_before
        assert job.status == "completed", job.error
        events = {e["type"]: e["at"] for e in client.training_jobs.events(job.id)}
        from datetime import datetime

        registered = datetime.fromisoformat(events["configuring"].replace("Z", "+00:00"))
        completed = datetime.fromisoformat(events["completed"].replace("Z", "+00:00"))
        veri_wall = (completed - registered).total_seconds()
        log = httpx.get(
            f"{api_url}/v1/training_jobs/{job.id}/logs/full",
            headers={"Authorization": f"Bearer {key}"},
        ).text
        veri_sps = steps_per_second(log)
    print(f"\nGRPO, {args.steps} steps, tiny Qwen2 + LoRA, CPU")
    print(f"  plain TRL script (start -> saved)    {plain_wall:7.2f} s   {plain_sps:.2f} steps/s")
    print(f"  Veri job (register -> completed)     {veri_wall:7.2f} s   {veri_sps:.2f} steps/s")
    print(f"  wall time ratio (veri / plain): {veri_wall / plain_wall:.3f}  (goal <= 1.05)")
    print(f"  steps/s ratio (veri / plain):   {veri_sps / plain_sps:.3f}  (goal >= 0.97)")
    print(
        f"  CPU the control plane (API server, qcluster) used meanwhile: {control_plane_cpu:.1f} s "
        f"of {veri_wall * os.cpu_count():.0f} core-seconds"
    )


if __name__ == "__main__":
    main()
