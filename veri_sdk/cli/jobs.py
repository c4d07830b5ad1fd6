"""`veri jobs …`, `veri datasets …`, `veri regions list`, `veri gpu list`, `veri billing`."""

import json
import sys
import time
from datetime import datetime

from veri_sdk.cli.output import err, human_bytes, out, print_json, print_table, table
from veri_sdk.errors import NotFoundError
from veri_sdk.training import TrainingJob

NO_LOGS_YET = "[no logs available yet]"
NEVER_UPLOADED = "log was never uploaded for this job"


STARTUP_PHASES = (
    ("queued", "queued"),
    ("launched", "launched"),
    ("registered", "worker registered"),
    ("volumes_synced", "volumes synced"),
    ("model_loaded", "model loaded"),
    ("first_step", "first step"),
    ("first_checkpoint", "first checkpoint"),
)


def _when(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def timings_line(timings: dict) -> str:
    """The phases the run reached, each with the seconds since the one before, e.g. `queued →
    launched +1.2s → worker registered +3.0s → volumes synced +0.4s (5.1 MiB, 12.8 MiB/s) → …`."""
    parts, before = [], None
    for key, label in STARTUP_PHASES:
        if not (at := timings.get(f"{key}_at")):
            continue
        part = label if before is None else f"{label} +{(_when(at) - before).total_seconds():.1f}s"
        if key == "volumes_synced" and timings.get("synced_bytes") is not None:
            rate = timings.get("sync_bytes_per_second")
            speed = f", {human_bytes(int(rate))}/s" if rate else ""
            part += f" ({human_bytes(timings['synced_bytes'])}{speed})"
        parts.append(part)
        before = _when(at)
    return " → ".join(parts)


def show_job(job: TrainingJob) -> None:
    rows = [
        ("id", job.id),
        ("status", job.status),
        ("method", job.method),
        ("base model", job.base_model),
        ("last step", job.last_step if job.last_step is not None else "-"),
        ("cost", f"{job.cost_usd} USD" if job.cost_usd is not None else "-"),
        ("created", job.created_at),
        ("finished", job.finished_at or "-"),
    ]
    if job.timings:
        rows.append(("start-up", timings_line(job.timings)))
    if job.status == "completed":  # what to serve: the final checkpoint, deployed by job id
        final = next((c for c in job.checkpoints() if c["final"]), None)
        if final is not None:
            rows.append(("checkpoint", f"{final['id']} (final; serve it: veri deploy {job.id})"))
    if job.error:
        error = job.error
        rows.append(("error", f"{error['code']} ({error['attribution']}): {error['message']}"))
    if job.refund:
        rows.append(("refund", f"{job.refund['amount_usd']} USD, {job.refund['status']}"))
    for run in job.restarts:
        credit = f", {run['credited_usd']} USD credited" if run.get("credited_usd") else ""
        rows.append(
            (
                f"run {run['attempt']}",
                f"ended by {run['cause']}: {run['kept_usd']} USD kept, "
                f"{run['lost_usd']} USD lost{credit}",
            )
        )
    for entry in job.ledger:
        if not entry["amount_usd"].startswith("-"):  # the charge is `cost` above
            rows.append(("credit", f"{entry['amount_usd']} USD: {entry['description']}"))
    if job.net_cost_usd is not None and job.credited_usd not in (None, "0.00"):
        rows.append(("net cost", f"{job.net_cost_usd} USD"))
    listing = table("FIELD", "VALUE", whole=("FIELD", "VALUE"), header=False)
    for name, value in rows:
        listing.add_row(name, str(value))
    print_table(listing)


def cmd_jobs_list(args, client) -> int:
    jobs = list(client.training_jobs.list())
    if args.json:
        print_json([job.data for job in jobs])
        return 0
    listing = table(
        "ID",
        "STATUS",
        "METHOD",
        "BASE MODEL",
        "STEP",
        "COST (USD)",
        "CREATED",
        whole=("ID", "STATUS", "BASE MODEL"),
    )
    for job in jobs:
        listing.add_row(
            job.id,
            job.status,
            job.method,
            job.base_model,
            str(job.last_step if job.last_step is not None else "-"),
            job.cost_usd or "-",
            job.created_at,
        )
    print_table(listing)
    return 0


def cmd_jobs_get(args, client) -> int:
    job = client.training_jobs.get(args.id)
    if args.json:
        print_json(job.data)
    else:
        show_job(job)
    return 0


def cmd_jobs_logs(args, client) -> int:
    """Everything so far (`-f`: and what follows, until the job ends, exiting 1 unless it
    completed; Ctrl+C detaches, exit 130). A job with no line yet prints `[no logs available
    yet]`; a finished one whose log was never uploaded fails, since none will ever come."""
    jobs, after, printed = client.training_jobs, -1, 0
    try:
        while True:
            page = jobs.logs(args.id, after=after)
            for line in page["lines"]:
                print(line["text"], flush=True)
            printed += len(page["lines"])
            after = page["next_seq"]
            if len(page["lines"]) == 1000:
                continue  # more pages right away
            if page["finished"] or not args.follow:
                break
            time.sleep(1)
    except KeyboardInterrupt:
        return detached(args.id)
    job = jobs.get(args.id) if args.follow or not printed else None
    if not printed:
        if not job.finished:
            print(NO_LOGS_YET)
            return 0
        try:
            text = jobs.full_log(args.id)
        except NotFoundError:
            err.print(f"error: {NEVER_UPLOADED}", highlight=False, markup=False)
            return failed(job) if args.follow and job.status != "completed" else 1
        print(text, end="")
    # Followed to its end, the exit code says how the job ended, for scripts.
    if args.follow and job.status != "completed":
        return failed(job)
    return 0


def cmd_jobs_cancel(args, client) -> int:
    job = client.training_jobs.cancel(args.id)
    out.print(f"{job.id} {job.status}; cost {job.cost_usd or '0.00'} USD")
    return 0


def cmd_jobs_resume(args, client) -> int:
    job = client.training_jobs.resume(args.id, checkpoint_id=args.checkpoint)
    out.print(f"Submitted {job.id}, continuing {args.id} from its checkpoint ({job.status}).")
    return 0


def cmd_jobs_download(args, client) -> int:
    fetched: list[bool] = []
    folder = client.training_jobs.download(
        args.id, output_dir=args.output, on_file=lambda _path, new: fetched.append(new)
    )
    got, had = fetched.count(True), fetched.count(False)
    if not got:
        out.print(
            f"All {had} file(s) of the final model of {args.id} are already in {folder}/ "
            "(sizes and sha256 checked); nothing downloaded."
        )
    else:
        skipped = f"; skipped {had} already there" if had else ""
        out.print(
            f"Downloaded {got} file(s) of the final model of {args.id} to {folder}/ "
            f"(sizes and sha256 checked){skipped}."
        )
    return 0


def show_quote(quote: dict) -> None:
    costs, seconds = quote["cost_usd"], quote["gpu_seconds"]
    out.print(
        f"{quote['gpu_count']}x {quote['gpu_type']} on {quote['provider']} in {quote['region']} "
        f"at {quote['price_per_hour_usd']} USD/hour"
    )
    out.print(
        f"GPU time {seconds['low'] // 60}-{seconds['high'] // 60} min "
        f"(expected {seconds['expected'] // 60} min); cost {costs['low']}-{costs['high']} USD "
        f"(expected {costs['expected']})"
        + (f"; capped at {quote['max_cost_usd']} USD" if quote["max_cost_usd"] else "")
    )
    listing = table("ASSUMPTION", "VALUE")
    for name, value in quote["assumptions"].items():
        listing.add_row(name, str(value))
    print_table(listing)


def cmd_datasets_upload(args, client) -> int:
    dataset = client.datasets.upload(args.file, name=args.name or "")
    if dataset.created:
        out.print(f"{dataset.id}  {dataset.row_count} rows  {dataset.name}")
    else:
        out.print(
            f"{dataset.id}  {dataset.row_count} rows  {dataset.name}  (reused: this workspace "
            "already had these bytes)"
        )
    return 0


def cmd_datasets_connect_hf(args, client) -> int:
    dataset = client.datasets.connect_hf(args.repo, split=args.split, revision=args.revision)
    out.print(f"{dataset.id}  {args.repo} ({args.split}); the worker fetches it")
    return 0


def cmd_datasets_list(args, client) -> int:
    datasets = [dataset.data for dataset in client.datasets.list()]
    if args.json:
        print_json(datasets)
        return 0
    listing = table("ID", "SOURCE", "NAME", "ROWS", "CREATED", whole=("ID", "NAME"))
    for d in datasets:
        rows = "-" if d["row_count"] is None else str(d["row_count"])
        listing.add_row(d["id"], d["source"], d["name"], rows, d["created_at"])
    print_table(listing)
    return 0


def cmd_datasets_preview(args, client) -> int:
    rows = client.datasets.preview(args.dataset_id, rows=args.rows)
    if args.json:
        print_json(rows)
        return 0
    for row in rows:  # as the file has them, one JSON row a line; never read as markup
        sys.stdout.write(json.dumps(row, ensure_ascii=False) + "\n")
    return 0


def cmd_datasets_delete(args, client) -> int:
    client.datasets.delete(args.dataset_id)
    out.print(f"Deleted {args.dataset_id}.")
    return 0


def cmd_regions_list(args, client) -> int:
    regions = client.regions.list()
    if args.json:
        print_json(regions)
        return 0
    listing = table("REGION", "NAME", "", whole=("REGION",))
    for region in regions:
        note = "default" if region["default"] else ("coming soon" if region["coming_soon"] else "")
        listing.add_row(region["code"], region["name"], note)
    print_table(listing)
    return 0


def cmd_gpu_list(args, client) -> int:
    gpus = client.gpus.list(provider=args.provider)
    if args.json:
        print_json(gpus)
        return 0
    # A job's gpu_count limit, not how many jobs run at once (the local provider's slots).
    columns = ["PROVIDER", "GPU", "MEMORY", "GPUS/JOB", "USD/GPU-HOUR", "REGIONS"]
    listing = table(*columns, "AVAILABLE NOW" if args.provider else "USABLE", whole=("REGIONS",))
    for gpu in gpus:
        if args.provider and not gpu["usable"]:
            last = "not configured here"  # not "none": nobody asked the provider
        elif args.provider:
            available = gpu.get("available_regions")
            last = "unknown" if available is None else ", ".join(available) or "none"
        else:
            last = "yes" if gpu["usable"] else "no (not configured here)"
        listing.add_row(
            gpu["provider"],
            gpu["gpu_type"],
            f"{gpu['memory_gb']} GB",
            str(gpu["max_count"]),
            gpu["price_per_gpu_hour_usd"],
            ", ".join(gpu["regions"]),
            last,
        )
    print_table(listing)
    if args.provider and gpus and not gpus[0]["usable"]:
        configured = dict.fromkeys(g["provider"] for g in client.gpus.list() if g["usable"])
        out.print(
            f"{args.provider} is not configured on this deployment; the providers that are: "
            f"{', '.join(configured) or 'none'}."
        )
    return 0


def cmd_billing(args, client) -> int:
    balance = client.billing.get()
    entries = client.billing.ledger(limit=args.limit)
    if args.json:
        print_json({"balance": balance.__dict__, "ledger": entries})
        return 0
    low = "  (low: below a day of recent spend)" if balance.low_balance else ""
    out.print(f"Balance: {balance.balance_usd} USD{low}")
    spent = ", ".join(f"{kind} {usd}" for kind, usd in balance.spend_usd.items())
    out.print(f"Spent so far (USD): {spent}")
    if not balance.payments_enabled:
        out.print("Card top-ups are off on this deployment; an operator adds credit.")
    listing = table(
        "WHEN", "KIND", "AMOUNT (USD)", "JOB / VOLUME", "DESCRIPTION", whole=("JOB / VOLUME",)
    )
    for entry in entries:
        listing.add_row(
            entry["created_at"],
            entry["kind"],
            entry["amount_usd"],
            entry["job_id"] or entry["volume_id"] or "",
            entry["description"],
        )
    print_table(listing)
    return 0


def cmd_billing_top_up(args, client) -> int:
    url = client.billing.top_up(args.amount)
    out.print(f"Pay {args.amount} USD here; the balance grows once the payment goes through:")
    out.print(url, soft_wrap=True)
    return 0


def detached(job_id: str) -> int:
    """Ctrl+C while following a job: it goes on; say so, and how to follow it again."""
    err.print(
        f"Detached; {job_id} keeps running. Follow it again with: veri jobs logs -f {job_id}",
        highlight=False,
        markup=False,
    )
    return 130  # as a shell reports a command ended by SIGINT


def failed(job: TrainingJob) -> int:
    """Say how a job ended badly, as the API says it, and the exit code for it."""
    if job.error:
        err.print(
            f"error: {job.id} failed: {job.error['code']} ({job.error['attribution']}): "
            f"{job.error['message']}",
            highlight=False,
            markup=False,
        )
    else:
        err.print(f"error: {job.id} ended {job.status}", highlight=False, markup=False)
    return 1
