from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from billing.services import micros_from_usd, open_billing_account, usd
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
            help="starting credit in USD, an `adjustment` entry in the ledger",
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
            credit_micros = micros_from_usd(credit) if credit is not None else 0
        except ArithmeticError:
            raise CommandError(f"--credit must be a number of dollars, not {credit!r}.") from None
        if credit_micros < 0:
            raise CommandError("--credit cannot be negative.")
        try:
            with transaction.atomic():
                workspace, api_key = services.create_workspace(name=name)
                if not no_billing:
                    open_billing_account(workspace=workspace, credit_micros=credit_micros)
        except VeriError as exc:
            raise CommandError(exc.message) from None
        self.stderr.write(f"Created workspace {workspace.name} ({workspace.public_id}).")
        if credit_micros:
            self.stderr.write(f"Credited {usd(credit_micros)} USD.")
        self.stdout.write(api_key)
