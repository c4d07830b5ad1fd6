import getpass
import os
import sys

from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from billing.services import open_billing_account
from veri import services
from veri.errors import VeriError
from veri.money import micros_from_usd, usd


class Command(BaseCommand):
    help = (
        "Create a workspace and print its API key alone on the last line; with --owner, also the "
        "account that signs in to the dashboard as its owner."
    )

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
        parser.add_argument(
            "--owner",
            metavar="EMAIL",
            help="the dashboard account that owns the workspace (created when new)",
        )
        parser.add_argument(
            "--password-env",
            metavar="VAR",
            help="a new owner's password from this environment variable (else it is asked for)",
        )

    def handle(
        self,
        *args,
        name: str,
        credit: str | None,
        no_billing: bool,
        owner: str | None,
        password_env: str | None,
        **options,
    ):
        if credit is not None and no_billing:
            raise CommandError("--credit needs a billing account; drop --no-billing.")
        try:
            credit_micros = micros_from_usd(credit) if credit is not None else 0
        except ArithmeticError:
            raise CommandError(f"--credit must be a number of dollars, not {credit!r}.") from None
        if credit_micros < 0:
            raise CommandError("--credit cannot be negative.")
        password = self.owner_password(owner, password_env) if owner else None
        try:
            with transaction.atomic():
                workspace, api_key = services.create_workspace(name=name)
                if not no_billing:
                    open_billing_account(workspace=workspace, credit_micros=credit_micros)
                if owner:
                    user, created = services.add_owner(
                        workspace=workspace, email=owner, password=password
                    )
        except VeriError as exc:
            raise CommandError(exc.message) from None
        self.stderr.write(f"Created workspace {workspace.name} ({workspace.public_id}).")
        if owner:
            how = "a new account" if created else "an existing account, password unchanged"
            self.stderr.write(f"Owner: {user.email} ({how}); sign in at /accounts/login/.")
        if credit_micros:
            self.stderr.write(f"Credited {usd(credit_micros)} USD.")
        self.stdout.write(api_key)

    def owner_password(self, email: str, password_env: str | None) -> str | None:
        """A new owner's password: from the named variable, else asked on a terminal. None for an
        existing account (its password is kept)."""
        if services.find_user(email=email) is not None:
            return None
        if password_env:
            password = os.environ.get(password_env, "")
            if not password:
                raise CommandError(
                    f"--password-env {password_env}: that variable is empty or unset."
                )
            return password
        if not sys.stdin.isatty():
            raise CommandError(
                f"{email} is a new account: give its password with --password-env VAR "
                "(no terminal to ask on)."
            )
        password = getpass.getpass(f"Password for {email}: ")
        if password != getpass.getpass("Again: "):
            raise CommandError("The passwords differ; nothing was created.")
        return password
