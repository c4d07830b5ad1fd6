import os
import secrets
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError

from billing.services import open_billing_account
from veri import services
from veri.models import Workspace

REPO = Path(settings.BASE_DIR)
SAMPLE_DATA = REPO / "examples" / "sample-data"
REWARD = REPO / "examples" / "rewards" / "letter_a.py"
DEMO_WORKSPACE, DEMO_VOLUME = "demo", "demo-data"
DEMO_OWNER = "demo@veri.local"
DEMO_CREDIT_MICROS = 10_000_000  # a starting credit of 10 USD, given once
MODEL_DIR = Path(settings.STATE_DIR) / "models" / "tiny-qwen2"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def next_steps(*, api_key: str, job_id: str) -> str:
    """The demo's `Next:` lines: what to run once it has trained `job_id`."""
    return (
        f"\nNext:\n  export VERI_API_URL=http://127.0.0.1:8000 VERI_API_KEY={api_key}\n"
        "  .venv/bin/python manage.py runserver & .venv/bin/python manage.py qcluster &\n"
        f"  .venv/bin/veri volumes ls {DEMO_VOLUME}\n"
        "  .venv/bin/veri train examples/train_grpo.py   # one decorated reward, one command\n"
        f"  .venv/bin/veri jobs get {job_id}   # the final checkpoint's id\n"
        f"  .venv/bin/veri deploy {job_id}   # serve it to the openai client at /v1\n"
        "  .venv/bin/veri billing\n"
        f"  open http://127.0.0.1:8000/ and sign in as {DEMO_OWNER} (password above)\n"
        "  .venv/bin/python manage.py createsuperuser   # then open http://127.0.0.1:8000/admin/\n"
        "  # (unattended: --noinput with DJANGO_SUPERUSER_PASSWORD, docs/operators/admin.md)\n"
    )


class Command(BaseCommand):
    help = (
        "The embedded default end to end: a workspace, a volume filled with the CLI, a tiny model "
        "made here, a real GRPO job on the local provider, its logs, and its checkpoint."
    )

    def add_arguments(self, parser):
        parser.add_argument("--steps", type=int, default=60, help="GRPO steps (default 60)")
        parser.add_argument("--checkpoints", default="checkpoints", help="where to download to")

    def handle(self, *args, steps: int, checkpoints: str, **options):
        call_command("migrate", verbosity=0)
        workspace = Workspace.objects.filter(name=DEMO_WORKSPACE).first()
        if workspace is None:
            workspace, api_key = services.create_workspace(name=DEMO_WORKSPACE)
        else:
            _, api_key = services.create_api_key(workspace=workspace, name="quickstart")
        open_billing_account(workspace=workspace, credit_micros=DEMO_CREDIT_MICROS)
        # A fresh password each run: the demo's dashboard account is only ever this machine's.
        password = secrets.token_urlsafe(12)
        owner, _ = services.add_owner(workspace=workspace, email=DEMO_OWNER, password=password)
        owner.set_password(password)
        owner.save(update_fields=["password"])
        self.step(f"Workspace {workspace.name} ({workspace.public_id}), owner {DEMO_OWNER}")
        if not (MODEL_DIR / "model.safetensors").exists():
            self.step(f"Making a tiny model in {MODEL_DIR} (no network)")
            self.run([sys.executable, "-m", "worker.tinymodel", str(MODEL_DIR)])

        port = free_port()
        api_url = f"http://127.0.0.1:{port}"
        env = {**os.environ, "VERI_PUBLIC_URL": api_url, "HF_HUB_OFFLINE": "1"}
        processes = [
            subprocess.Popen(
                [sys.executable, "manage.py", "runserver", f"127.0.0.1:{port}", "--noreload"],
                cwd=REPO,
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            ),
            subprocess.Popen(
                [sys.executable, "manage.py", "qcluster"],
                cwd=REPO,
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            ),
        ]
        try:
            self.wait_for(api_url)
            self.step(f"API server on {api_url}, qcluster running, provider: local")
            cli_env = {**env, "VERI_API_URL": api_url, "VERI_API_KEY": api_key}
            self.veri(cli_env, "volumes", "create", DEMO_VOLUME)
            self.veri(cli_env, "volumes", "upload-dir", DEMO_VOLUME, str(SAMPLE_DATA))
            self.veri(
                cli_env,
                "volumes",
                "upload-dir",
                DEMO_VOLUME,
                str(MODEL_DIR),
                "--prefix",
                "models/tiny-qwen2",
            )
            self.veri(cli_env, "volumes", "ls", DEMO_VOLUME)
            job_id = self.train(api_url, api_key, steps, Path(checkpoints))
            self.stdout.write(
                f"  dashboard   http://127.0.0.1:8000/ once the server below runs: sign in as "
                f"{DEMO_OWNER} with password {password}\n"
            )
        finally:
            for process in processes:
                process.terminate()
            for process in processes:
                process.wait()
        self.stdout.write(next_steps(api_key=api_key, job_id=job_id))

    def train(self, api_url: str, api_key: str, steps: int, checkpoints: Path) -> str:
        """Train the demo's job to the end; its id."""
        from veri_sdk import Client

        client = Client(api_key=api_key, base_url=api_url)
        dataset = client.datasets.from_volume(DEMO_VOLUME, "train.jsonl")
        self.step(f"Dataset {dataset.id}: {DEMO_VOLUME}/train.jsonl (read from the volume's mount)")
        job = client.training_jobs.create(
            base_model=f"volume://{DEMO_VOLUME}/models/tiny-qwen2",
            dataset_id=dataset.id,
            method="grpo",
            reward_source=REWARD.read_text(),
            output_name="tiny-grpo-letter-a",
            gpu_type="cpu",
            hyperparameters={
                "learning_rate": 5e-2,  # learns by about step 10 (1e-2 only after step 33)
                "max_steps": steps,
                "batch_size": 16,
                "rollouts_per_prompt": 8,
                "max_response_length": 16,
                "kl_coef": 0.0,
            },
            lora={
                "r": 8,
                "alpha": 16,
                "dropout": 0.0,
                "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"],
            },
            volumes=[DEMO_VOLUME],
        )
        self.step(
            f"Submitted {job.id} (GRPO, {steps} steps, reward {REWARD.relative_to(REPO)}); its log:"
        )
        self.stdout.flush()
        job = job.wait(poll_interval=1)
        if job.status != "completed":
            raise CommandError(f"{job.id} ended {job.status}: {job.error}")
        folder = job.download(checkpoints)
        rewards = [
            p["values"]["reward"]
            for p in client.training_jobs.metrics(job.id)
            if "reward" in p["values"]
        ]
        fifth = max(1, len(rewards) // 5)
        first, last = sum(rewards[:fifth]) / fifth, sum(rewards[-fifth:]) / fifth
        self.stdout.write(self.style.SUCCESS("\nQuickstart finished"))
        self.stdout.write(
            f"  job         {job.id}: {job.status}, {job.last_step} steps\n"
            f"  reward      {first:.3f} (first steps) -> {last:.3f} (last steps)\n"
            f"  charge      {job.cost_usd} USD on the local provider; the workspace's balance is "
            f"now {client.billing.get().balance_usd} USD (veri billing shows the ledger)\n"
            f"  checkpoint  {folder}/ (its base is {MODEL_DIR.relative_to(REPO)}: "
            "PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), folder); "
            "README: Loading a trained adapter)\n"
        )
        return job.id

    def step(self, text: str) -> None:
        self.stdout.write(self.style.MIGRATE_HEADING(f"==> {text}"))

    def run(self, command: list[str]) -> None:
        if subprocess.run(command, cwd=REPO, stdout=subprocess.DEVNULL).returncode != 0:
            raise CommandError(f"{' '.join(command)} failed.")

    def veri(self, env: dict, *args: str) -> None:
        self.step("veri " + " ".join(args))
        self.stdout.flush()
        result = subprocess.run([sys.executable, "-m", "veri_sdk", *args], env=env)
        if result.returncode != 0:
            raise CommandError(f"`veri {' '.join(args)}` failed (exit {result.returncode}).")

    @staticmethod
    def wait_for(api_url: str) -> None:
        for _ in range(150):
            try:
                httpx.get(f"{api_url}/v1/schema", timeout=1)
                return
            except httpx.TransportError:
                time.sleep(0.2)
        raise CommandError(f"The API server did not start on {api_url}.")
