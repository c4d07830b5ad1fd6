"""`veri secrets`: set (the value from a hidden prompt or stdin, never the command line, where
shell history and `ps` would keep it), list, delete."""

import getpass
import sys

from veri_sdk.cli.output import err, out, print_json, print_table, table


def cmd_secrets_set(args, client) -> int:
    if sys.stdin.isatty():
        value = getpass.getpass(f"Value of {args.name} (not shown): ")
    else:  # `veri secrets set NAME < file`, or piped from a password manager
        value = sys.stdin.read().rstrip("\r\n")
    if not value:
        err.print("error: no value given (type it at the prompt, or pipe it in)")
        return 2
    secret = client.secrets.set(args.name, value)
    out.print(f"{secret.name} set ({secret.updated_at})")
    return 0


def cmd_secrets_list(args, client) -> int:
    secrets = client.secrets.list()
    if args.json:
        print_json([s.__dict__ for s in secrets])
        return 0
    listing = table("NAME", "CREATED", "UPDATED", whole=("NAME",))
    for s in secrets:
        listing.add_row(s.name, s.created_at, s.updated_at)
    print_table(listing)
    return 0


def cmd_secrets_delete(args, client) -> int:
    client.secrets.delete(args.name)
    out.print(f"{args.name} deleted")
    return 0
