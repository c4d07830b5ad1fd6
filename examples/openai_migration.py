"""An OpenAI fine-tuning script, run on Veri with the official `openai` client.

Only the three lines marked `# Veri` differ from the script written for OpenAI: where the API
is, its key, and the model (an open model: a hub id, or `volume://…`). Everything else is
OpenAI's own API: files, jobs, events, checkpoints, the fine-tuned model's name.

    source .venv/bin/activate
    python manage.py runserver & python manage.py qcluster &   # make demo stopped its own
    export VERI_API_URL=http://127.0.0.1:8000 VERI_API_KEY=veri_sk_…   # make demo printed it
    python examples/openai_migration.py

It trains the tiny model `make demo` put in the volume demo-data; see
docs/user-guide/openai.md ("Coming from OpenAI fine-tuning")."""

import os
import time
from pathlib import Path

from openai import OpenAI

client = OpenAI(
    base_url=os.environ.get("VERI_API_URL", "http://127.0.0.1:8000") + "/v1",  # Veri
    api_key=os.environ["VERI_API_KEY"],  # Veri
)
MODEL = "volume://demo-data/models/tiny-qwen2"  # Veri (was "gpt-4.1-mini-2025-04-14")

training_file = client.files.create(
    file=Path(__file__).parent / "sample-data" / "chat.jsonl", purpose="fine-tune"
)
job = client.fine_tuning.jobs.create(
    model=MODEL,
    training_file=training_file.id,
    suffix="adder",
    method={"type": "supervised", "supervised": {"hyperparameters": {"n_epochs": 2}}},
)
print(f"created {job.id} ({job.status})")

while job.status not in ("succeeded", "failed", "cancelled"):
    time.sleep(2)
    job = client.fine_tuning.jobs.retrieve(job.id)

for event in reversed(list(client.fine_tuning.jobs.list_events(job.id, limit=100))):
    print(f"  {event.message}")
for checkpoint in client.fine_tuning.jobs.checkpoints.list(job.id):
    print(f"checkpoint at step {checkpoint.step_number}: {checkpoint.metrics.train_loss:.3f}")
if job.status != "succeeded":
    raise SystemExit(f"{job.id} {job.status}: {job.error}")
print(f"fine-tuned model: {job.fine_tuned_model}")
