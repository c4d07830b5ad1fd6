"""`veri deploy MODEL` and `veri deployments list|get|delete`: serving trained models."""

from veri_sdk.cli.output import err, out, print_json, print_table, table
from veri_sdk.errors import ConflictError

STARTING = ("pending", "starting")  # a stopped deployment waits for its first request


def _shape(args) -> dict:
    names = ("min_replicas", "max_replicas", "idle_timeout_seconds", "gpu_type", "provider")
    return {name: getattr(args, name) for name in names if getattr(args, name) is not None}


def cmd_deploy(args, client) -> int:
    try:
        deployment = client.deployments.create(args.model, adapters=args.adapter, **_shape(args))
    except ConflictError as exc:
        if exc.code != "already_deployed":
            raise
        # Deploying it again would bill a twin the router never sends a request to: use it.
        existing = exc.extra["deployment_id"]
        err.print(f"{args.model} is already deployed as {existing}.", highlight=False, markup=False)
        deployment = client.deployments.get(existing)
    if not args.no_wait and deployment["status"] in STARTING:
        deployment = client.deployments.wait_ready(deployment["id"], timeout=args.timeout)
    if args.json:
        print_json(deployment)
        return 0 if deployment["status"] != "failed" else 1
    if deployment["status"] == "failed":
        error = deployment["error"]
        out.print(f"{deployment['id']} failed: {error['code']}: {error['message']}", markup=False)
        return 1
    names = [a["name"] for a in deployment["adapters"]] or [deployment["base_model"]]
    out.print(f"{deployment['id']} {deployment['status']}", highlight=False)
    out.print(
        f"Call it with the openai client: base_url={client.base_url}/v1, model={names[0]!r}",
        highlight=False,
        markup=False,
    )
    return 0


def cmd_deployments_list(args, client) -> int:
    deployments = client.deployments.list()
    if args.json:
        print_json(deployments)
        return 0
    listing = table("ID", "STATUS", "MODELS", "REPLICAS", "IDLE", "CREATED", whole=("ID", "MODELS"))
    for d in deployments:
        models = ", ".join(a["name"] for a in d["adapters"]) or d["base_model"]
        replicas = f"{d['min_replicas']}-{d['max_replicas']}"
        idle = f"{d['idle_timeout_seconds']}s"
        listing.add_row(d["id"], d["status"], models, replicas, idle, d["created_at"])
    print_table(listing)
    return 0


def cmd_deployments_get(args, client) -> int:
    print_json(client.deployments.get(args.id))
    return 0


def cmd_deployments_delete(args, client) -> int:
    client.deployments.delete(args.id)
    out.print(f"Deleted deployment {args.id}; its replicas are stopped.", highlight=False)
    return 0
