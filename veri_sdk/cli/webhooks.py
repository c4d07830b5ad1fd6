"""`veri webhooks …`: endpoints that receive signed events, and their delivery log."""

from veri_sdk.cli.output import out, print_json, print_table, table


def cmd_webhooks_create(args, client) -> int:
    endpoint = client.webhooks.create(
        args.url, event_types=args.event, description=args.description or ""
    )
    if args.json:
        print_json(endpoint)
        return 0
    out.print(f"{endpoint['id']}  {endpoint['url']}", highlight=False)
    out.print("Signing secret, shown this once (verify deliveries with it):", highlight=False)
    out.print(endpoint["signing_secret"], highlight=False, markup=False)
    return 0


def cmd_webhooks_list(args, client) -> int:
    endpoints = client.webhooks.list()
    if args.json:
        print_json(endpoints)
        return 0
    listing = table("ID", "URL", "EVENTS", "ENABLED", "SECRET", "CREATED", whole=("ID", "URL"))
    for e in endpoints:
        events = ", ".join(e["event_types"]) or "all"
        enabled = "yes" if e["enabled"] else "no"
        listing.add_row(
            e["id"], e["url"], events, enabled, e["signing_secret_hint"], e["created_at"]
        )
    print_table(listing)
    return 0


def cmd_webhooks_deliveries(args, client) -> int:
    deliveries = client.webhooks.deliveries(args.id, limit=args.limit)
    if args.json:
        print_json(deliveries)
        return 0
    listing = table("EVENT", "TYPE", "STATUS", "TRIES", "LAST", "NEXT", "CREATED", whole=("EVENT",))
    for d in deliveries:
        last = str(d["last_status_code"] or d["last_error"] or "—")
        upcoming = d["next_attempt_at"] if d["status"] == "pending" else "—"
        tries = str(d["attempt_count"])
        listing.add_row(d["id"], d["type"], d["status"], tries, last, upcoming, d["created_at"])
    print_table(listing)
    return 0


def cmd_webhooks_delete(args, client) -> int:
    client.webhooks.delete(args.id)
    out.print(f"Deleted webhook endpoint {args.id}.", highlight=False)
    return 0


def cmd_webhooks_test(args, client) -> int:
    delivery = client.webhooks.test(args.id)
    out.print(
        f"Queued a webhook.test event ({delivery['id']}); "
        f"`veri webhooks deliveries {args.id}` shows how it went.",
        highlight=False,
        markup=False,
    )
    return 0
