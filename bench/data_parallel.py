"""The same SFT job on one CPU process and on two (gloo, data-parallel, `gpu_count: 2`), each
through the embedded platform, in one run: steps/s and rows/s of each, and the ratio.

    .venv/bin/python -m bench.data_parallel [--steps 40] [--batch 16]

Both jobs take the same number of optimizer steps over the same global batch; the two processes
each take half of it. On a 2-core machine the two processes share those cores with each other and
with the control plane, so this measures the data-parallel path's overhead more than a speed-up.
"""

import argparse
import json
import tempfile
from pathlib import Path

from bench.common import (
    embedded_env,
    embedded_platform,
    free_port,
    new_workspace,
    steps_per_second,
    tiny_model,
)

ROWS = [
    {"text": f"What is {a} plus {b}? The answer is {a + b}."} for a in range(8) for b in range(8)
]
LORA = {"r": 8, "alpha": 16, "dropout": 0.0, "target_modules": ["q_proj", "k_proj", "v_proj"]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--batch", type=int, default=16)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="veri-dp-"))
    port = free_port()
    env = embedded_env(work, port) | {"VERI_LOCAL_SLOTS": "1"}
    key = new_workspace(env, "bench", "--credit", "100")
    model = tiny_model(env, work / "tiny")
    data = work / "sft.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in ROWS))
    results = {}
    with embedded_platform(env, port):
        from veri_sdk import Client

        client = Client(api_key=key, base_url=f"http://127.0.0.1:{port}")
        client.volumes.create("models")
        client.volumes.upload_dir("models", model, prefix="tiny")
        dataset = client.datasets.upload(data)
        for gpu_count in (1, 2):
            job = client.training_jobs.create(
                base_model="volume://models/tiny",
                dataset_id=dataset.id,
                method="sft_text",
                gpu_type="cpu",
                gpu_count=gpu_count,
                lora=LORA,
                hyperparameters={
                    "learning_rate": 5e-3,
                    "max_steps": args.steps,
                    "batch_size": args.batch,
                    "max_seq_length": 64,
                },
            )
            job = client.training_jobs.wait(job.id, poll_interval=0.5, stream=False)
            assert job.status == "completed", job.error
            results[gpu_count] = steps_per_second("\n".join(job.logs()))
    print(f"\nSFT, {args.steps} steps, global batch {args.batch}, tiny Qwen2 + LoRA, CPU")
    for gpu_count, sps in results.items():
        print(f"  {gpu_count} process(es): {sps:6.2f} steps/s  {sps * args.batch:7.1f} rows/s")
    print(f"  ratio (2 processes / 1): {results[2] / results[1]:.2f}")


if __name__ == "__main__":
    main()
