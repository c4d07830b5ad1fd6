from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from billing.services import open_billing_account
from veri import services
from veri.errors import VeriError


class Command(BaseCommand):
    help = "Create a workspace and print its API key alone on the last line."

    def add_arguments(self, parser):
        parser.add_argument("name")
        parser.add_argument(
            "--credit",
            type=str,
            default=None,
            help="starting credit in USD (applied once the billing ledger exists)",
        )
        parser.add_argument(
            "--no-billing",
            action="store_true",
            help="no billing account: the workspace cannot submit training jobs (402)",
        )

    def handle(self, *args, name: str, credit: str | None, no_billing: bool, **options):
        if credit is not None and no_billing:
            raise CommandError("--credit needs a billing account; drop --no-billing.")
        try:
            with transaction.atomic():
                workspace, api_key = services.create_workspace(name=name)
                if not no_billing:
                    open_billing_account(workspace=workspace)
        except VeriError as exc:
            raise CommandError(exc.message) from None
        self.stderr.write(f"Created workspace {workspace.name} ({workspace.public_id}).")
        if credit is not None:
            self.stderr.write("Note: --credit is not applied yet; the ledger arrives with billing.")
        self.stdout.write(api_key)
