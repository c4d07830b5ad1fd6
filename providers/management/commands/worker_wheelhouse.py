"""`manage.py worker_wheelhouse --backend cu124`: download the worker's pinned dependencies for
rented machines and keep them in the object store, where their bootstrap installs from in
seconds (same region, no public index). Run once per Veri version and torch backend in use."""

from django.conf import settings
from django.core.management.base import BaseCommand

from providers import worker_dist


class Command(BaseCommand):
    help = "Store the wheelhouse rented machines install the worker's dependencies from."

    def add_arguments(self, parser):
        parser.add_argument(
            "--backend",
            action="append",
            choices=worker_dist.BACKENDS,
            required=True,
            help="torch build: cpu, or the CUDA version it needs (repeat for several)",
        )
        parser.add_argument(
            "--torch-index-url",
            default=worker_dist.TORCH_INDEX_URL,
            help="PyTorch's wheel index root ('' for pip's own configuration)",
        )

    def handle(self, *args, backend: list[str], torch_index_url: str, **options):
        python = settings.VERI_WORKER_PYTHON
        worker = worker_dist.worker_files()
        self.stdout.write(f"worker: {', '.join(f.name for f in worker)}")
        for name in backend:
            self.stdout.write(f"downloading the worker's dependencies for py{python}/{name} …")
            files = worker_dist.fill_wheelhouse(
                python=python, backend=name, torch_index_url=torch_index_url or None
            )
            self.stdout.write(f"wheelhouse py{python}/{name}: {len(files)} wheels")
