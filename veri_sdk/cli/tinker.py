"""`veri tinker key`: a key for the official `tinker` SDK, printed once with the two lines a
Tinker user sets; `veri tinker keys` lists them, `veri tinker revoke ID` ends one."""

from veri_sdk.cli.output import out, print_json, print_table, table


def cmd_tinker_key(args, client) -> int:
    key = client.tinker.create_key(args.name or "")
    if args.json:
        print_json(key.__dict__)
        return 0
    out.print(f"Tinker key {key.id} (shown once):", highlight=False)
    out.print(f"export TINKER_API_KEY={key.key}", highlight=False, markup=False)
    out.print(f"export TINKER_BASE_URL={client.base_url}", highlight=False, markup=False)
    return 0


def cmd_tinker_keys(args, client) -> int:
    keys = client.tinker.list_keys()
    if args.json:
        print_json([k.__dict__ for k in keys])
        return 0
    listing = table("ID", "NAME", "PREFIX", "CREATED", "LAST USED", "REVOKED", whole=("ID",))
    for k in keys:
        listing.add_row(
            k.id, k.name, k.prefix, k.created_at, k.last_used_at or "-", k.revoked_at or "-"
        )
    print_table(listing)
    return 0


def cmd_tinker_revoke(args, client) -> int:
    key = client.tinker.revoke_key(args.id)
    out.print(f"{key.id} revoked ({key.revoked_at})", highlight=False)
    return 0
