import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError

from veri import services
from veri.models import Workspace

SAMPLE_DATA = Path(settings.BASE_DIR) / "examples" / "sample-data"
DEMO_WORKSPACE = "demo"
DEMO_VOLUME = "demo-data"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Command(BaseCommand):
    help = "The embedded default end to end: workspace, API server, a volume filled by the CLI."

    def handle(self, *args, **options):
        call_command("migrate", verbosity=0)
        workspace = Workspace.objects.filter(name=DEMO_WORKSPACE).first()
        if workspace is None:
            workspace, api_key = services.create_workspace(name=DEMO_WORKSPACE)
        else:
            _, api_key = services.create_api_key(workspace=workspace, name="quickstart")
        self.step(f"Workspace {workspace.name} ({workspace.public_id})")

        port = free_port()
        api_url = f"http://127.0.0.1:{port}"
        server = subprocess.Popen(
            [sys.executable, "manage.py", "runserver", f"127.0.0.1:{port}", "--noreload"],
            cwd=settings.BASE_DIR,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            self.wait_for(api_url)
            self.step(f"API server on {api_url}")
            env = {**os.environ, "VERI_API_URL": api_url, "VERI_API_KEY": api_key}
            self.veri(env, "volumes", "create", DEMO_VOLUME)
            self.veri(env, "volumes", "upload-dir", DEMO_VOLUME, str(SAMPLE_DATA))
            self.veri(env, "volumes", "ls", DEMO_VOLUME)
        finally:
            server.terminate()
            server.wait()

        self.stdout.write(self.style.SUCCESS("\nDone. Next:"))
        self.stdout.write(
            f"  export VERI_API_KEY={api_key}\n"
            "  .venv/bin/python manage.py runserver          # the API on http://127.0.0.1:8000\n"
            f"  .venv/bin/veri volumes ls {DEMO_VOLUME}\n"
            "  .venv/bin/python manage.py createsuperuser    # then open http://127.0.0.1:8000/admin/\n"
        )

    def step(self, text: str) -> None:
        self.stdout.write(self.style.MIGRATE_HEADING(f"==> {text}"))

    def veri(self, env: dict, *args: str) -> None:
        self.step("veri " + " ".join(args))
        self.stdout.flush()
        result = subprocess.run([sys.executable, "-m", "veri_sdk", *args], env=env)
        if result.returncode != 0:
            raise CommandError(f"`veri {' '.join(args)}` failed (exit {result.returncode}).")

    @staticmethod
    def wait_for(api_url: str) -> None:
        for _ in range(100):
            try:
                httpx.get(f"{api_url}/v1/schema", timeout=1)
                return
            except httpx.TransportError:
                time.sleep(0.2)
        raise CommandError(f"The API server did not start on {api_url}.")
