"""The `veri` command. Exit codes: 0 success, 1 the request failed (message on stderr), 2 usage
(including a job file that cannot be submitted as written)."""

import argparse
import sys

from veri_sdk.cli import (
    deployments,
    evaluations,
    jobs,
    secrets,
    tinker,
    train,
    volumes,
    webhooks,
)
from veri_sdk.cli.output import err
from veri_sdk.client import Client
from veri_sdk.errors import AuthenticationError, VeriAPIError
from veri_sdk.http import LOGIN_HINT


def _json_flag(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("--json", action="store_true", help="print the API's JSON")
    return parser


def _job_file_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--region", help="launch region (veri regions list)")
    parser.add_argument("--gpu-type", dest="gpu_type", help="e.g. L4-24GB (veri gpu list)")
    parser.add_argument("--provider", help="aws, vast, digitalocean, gcp or local")
    parser.add_argument("--detach", action="store_true", help="submit and return at once")
    parser.add_argument("--no-check", action="store_true", help="skip the local reward check")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="veri", description="Veri: managed LLM training.")
    parser.add_argument("--api-url", help="default: VERI_API_URL, else `veri login`'s")
    parser.add_argument("--api-key", help="default: VERI_API_KEY, else `veri login`'s")
    commands = parser.add_subparsers(dest="command", required=True)

    login = commands.add_parser("login", help="save the API URL and key to ~/.config/veri")
    # SUPPRESS: the subcommand must not reset what was given before it (`veri --api-url U login`).
    login.add_argument("--api-url", default=argparse.SUPPRESS, help="e.g. http://127.0.0.1:8000")
    login.add_argument("--api-key", default=argparse.SUPPRESS, help="asked for when not given")
    login.set_defaults(run=volumes.cmd_login, needs_client=False)

    vol = commands.add_parser("volumes", help="named storage mounted into training jobs")
    vc = vol.add_subparsers(dest="volumes_command", required=True)
    create = vc.add_parser("create", help="create a volume (same name: returns the existing one)")
    create.add_argument("name")
    create.add_argument("--region")
    create.set_defaults(run=volumes.cmd_volumes_create)
    upload = vc.add_parser("upload", help="upload one file, with a progress bar")
    upload.add_argument("name")
    upload.add_argument("file")
    upload.add_argument("--path", help="path inside the volume (default: the file's name)")
    upload.set_defaults(run=volumes.cmd_volumes_upload)
    upload_dir = vc.add_parser(
        "upload-dir",
        help="upload a folder (files up to 1 MiB in packs, many to one PUT), skipping files "
        "already there",
    )
    upload_dir.add_argument("name")
    upload_dir.add_argument("dir")
    upload_dir.add_argument("--prefix", help="folder inside the volume to upload into")
    upload_dir.set_defaults(run=volumes.cmd_volumes_upload_dir)
    _json_flag(vc.add_parser("list", help="list volumes")).set_defaults(
        run=volumes.cmd_volumes_list
    )
    ls = _json_flag(vc.add_parser("ls", help="list a volume's files"))
    ls.add_argument("name")
    ls.add_argument("--prefix")
    ls.set_defaults(run=volumes.cmd_volumes_ls)
    delete = vc.add_parser("delete", help="delete a volume and its files")
    delete.add_argument("name")
    delete.add_argument("--yes", action="store_true", help="do not ask for the name")
    delete.set_defaults(run=volumes.cmd_volumes_delete)

    ds = commands.add_parser("datasets", help="training data: a .jsonl, a hub dataset")
    dc = ds.add_subparsers(dest="datasets_command", required=True)
    ds_upload = dc.add_parser("upload", help="upload a .jsonl (checked for every method)")
    ds_upload.add_argument("file")
    ds_upload.add_argument("--name")
    ds_upload.set_defaults(run=jobs.cmd_datasets_upload)
    hf = dc.add_parser("connect-hf", help="a Hugging Face dataset the worker fetches")
    hf.add_argument("repo", help="e.g. openai/gsm8k")
    hf.add_argument("--split", default="train")
    hf.add_argument("--revision", default="main")
    hf.set_defaults(run=jobs.cmd_datasets_connect_hf)
    _json_flag(dc.add_parser("list", help="list datasets")).set_defaults(run=jobs.cmd_datasets_list)
    preview = _json_flag(dc.add_parser("preview", help="print a dataset's first rows"))
    preview.add_argument("dataset_id")
    preview.add_argument("--rows", type=int, default=5, help="how many (at most 50)")
    preview.set_defaults(run=jobs.cmd_datasets_preview)
    ds_delete = dc.add_parser("delete", help="delete a dataset no job uses")
    ds_delete.add_argument("dataset_id")
    ds_delete.set_defaults(run=jobs.cmd_datasets_delete)

    jb = commands.add_parser("jobs", help="training jobs")
    jc = jb.add_subparsers(dest="jobs_command", required=True)
    _json_flag(jc.add_parser("list", help="list jobs, newest first")).set_defaults(
        run=jobs.cmd_jobs_list
    )
    get = _json_flag(jc.add_parser("get", help="one job: status, error, cost, refund"))
    get.add_argument("id")
    get.set_defaults(run=jobs.cmd_jobs_get)
    logs = jc.add_parser("logs", help="the job's log so far (-f: follow it)")
    logs.add_argument("id")
    logs.add_argument("-f", "--follow", action="store_true", help="until the job ends")
    logs.set_defaults(run=jobs.cmd_jobs_logs)
    cancel = jc.add_parser("cancel", help="cancel now (before running: not charged)")
    cancel.add_argument("id")
    cancel.set_defaults(run=jobs.cmd_jobs_cancel)
    resume = jc.add_parser("resume", help="a new job from the newest (or given) checkpoint")
    resume.add_argument("id")
    resume.add_argument("--checkpoint", help="a ckpt_ id (default: the newest)")
    resume.set_defaults(run=jobs.cmd_jobs_resume)
    download = jc.add_parser("download", help="the final model into DIR/<job id>/")
    download.add_argument("id")
    download.add_argument("-o", "--output", default="./checkpoints")
    download.set_defaults(run=jobs.cmd_jobs_download)
    quote = _json_flag(jc.add_parser("quote", help="what a job file's job would cost"))
    quote.add_argument("file", help='a TOML job (kind = "train") or a @training_job file')
    quote.set_defaults(run=train.cmd_jobs_quote)

    tr = commands.add_parser("train", help="check, submit and follow a @training_job reward")
    tr.add_argument("file", help="a Python file with one @training_job(...) reward")
    _job_file_options(tr)
    tr.set_defaults(run=train.cmd_train)
    run = commands.add_parser("run", help='check, submit and follow a TOML job (kind = "train")')
    run.add_argument("file")
    _job_file_options(run)
    run.set_defaults(run=train.cmd_run)

    rw = commands.add_parser("rewards", help="GRPO reward functions")
    rc = rw.add_subparsers(dest="rewards_command", required=True)
    rtest = rc.add_parser("test", help="run a reward on this machine on sample completions")
    rtest.add_argument("file")
    rtest.add_argument("--dataset", help="a .jsonl whose prompts (and completions) to use")
    rtest.add_argument("-n", type=int, default=16, help="completions to score (default 16)")
    rtest.set_defaults(run=train.cmd_rewards_test, needs_client=False)

    rg = commands.add_parser("regions", help="launch regions")
    rgc = rg.add_subparsers(dest="regions_command", required=True)
    _json_flag(rgc.add_parser("list", help="default marked, coming soon flagged")).set_defaults(
        run=jobs.cmd_regions_list
    )
    gpu = commands.add_parser("gpu", help="GPU types and prices")
    gc = gpu.add_subparsers(dest="gpu_command", required=True)
    gpu_list = _json_flag(gc.add_parser("list", help="the catalog (--provider: available now)"))
    gpu_list.add_argument("--provider")
    gpu_list.set_defaults(run=jobs.cmd_gpu_list)

    sc = commands.add_parser(
        "secrets", help="values Veri uses for the workspace (WANDB_API_KEY), never shown back"
    ).add_subparsers(dest="secrets_command", required=True)
    secret_set = sc.add_parser("set", help="set NAME from a hidden prompt, or from stdin")
    secret_set.add_argument("name", help="e.g. WANDB_API_KEY")
    secret_set.set_defaults(run=secrets.cmd_secrets_set)
    _json_flag(sc.add_parser("list", help="names and times, never values")).set_defaults(
        run=secrets.cmd_secrets_list
    )
    secret_delete = sc.add_parser("delete", help="delete NAME")
    secret_delete.add_argument("name")
    secret_delete.set_defaults(run=secrets.cmd_secrets_delete)

    tk = commands.add_parser("tinker", help="keys for the official tinker SDK (/api/v1)")
    tkc = tk.add_subparsers(dest="tinker_command", required=True)
    tk_key = _json_flag(tkc.add_parser("key", help="a new tml- key, shown once"))
    tk_key.add_argument("--name", help="to tell keys apart")
    tk_key.set_defaults(run=tinker.cmd_tinker_key)
    _json_flag(tkc.add_parser("keys", help="list keys, newest first")).set_defaults(
        run=tinker.cmd_tinker_keys
    )
    tk_revoke = tkc.add_parser("revoke", help="revoke key ID: the client gets an auth error")
    tk_revoke.add_argument("id")
    tk_revoke.set_defaults(run=tinker.cmd_tinker_revoke)

    billing = _json_flag(
        commands.add_parser("billing", help="balance, spend by kind, recent entries")
    )
    billing.add_argument("--limit", type=int, default=20, help="entries to show (default 20)")
    billing.set_defaults(run=jobs.cmd_billing)
    bc = billing.add_subparsers(dest="billing_command")
    top_up = bc.add_parser("top-up", help="a card payment page that adds AMOUNT USD")
    top_up.add_argument("amount", help="in USD, e.g. 25")
    top_up.set_defaults(run=jobs.cmd_billing_top_up)

    wh = commands.add_parser("webhooks", help="endpoints that receive signed job events")
    whc = wh.add_subparsers(dest="webhooks_command", required=True)
    wh_create = _json_flag(whc.add_parser("create", help="register URL (answers its secret once)"))
    wh_create.add_argument("url")
    wh_create.add_argument(
        "--event",
        action="append",
        metavar="TYPE",
        help="an event type to receive, e.g. training_job.failed (repeatable; default: all)",
    )
    wh_create.add_argument("--description")
    wh_create.set_defaults(run=webhooks.cmd_webhooks_create)
    _json_flag(whc.add_parser("list", help="list endpoints")).set_defaults(
        run=webhooks.cmd_webhooks_list
    )
    wh_deliveries = _json_flag(
        whc.add_parser("deliveries", help="an endpoint's deliveries, newest first")
    )
    wh_deliveries.add_argument("id")
    wh_deliveries.add_argument("--limit", type=int, default=20, help="how many (default 20)")
    wh_deliveries.set_defaults(run=webhooks.cmd_webhooks_deliveries)
    wh_delete = whc.add_parser("delete", help="remove an endpoint and its delivery log")
    wh_delete.add_argument("id")
    wh_delete.set_defaults(run=webhooks.cmd_webhooks_delete)
    wh_test = whc.add_parser("test", help="send a webhook.test event to an endpoint")
    wh_test.add_argument("id")
    wh_test.set_defaults(run=webhooks.cmd_webhooks_test)

    deploy = _json_flag(
        commands.add_parser("deploy", help="serve MODEL (ft:… or a base) behind /v1/chat/…")
    )
    deploy.add_argument("model", help="an ft: model, a checkpoint id, or a base model")
    deploy.add_argument("--adapter", action="append", help="another adapter to serve (repeatable)")
    deploy.add_argument("--min-replicas", dest="min_replicas", type=int)
    deploy.add_argument("--max-replicas", dest="max_replicas", type=int)
    deploy.add_argument("--idle-timeout", dest="idle_timeout_seconds", type=int, metavar="SECONDS")
    deploy.add_argument("--gpu-type", dest="gpu_type")
    deploy.add_argument("--provider")
    deploy.add_argument("--no-wait", action="store_true", help="answer at once, not once ready")
    deploy.add_argument("--timeout", type=float, default=900, help="seconds to wait (900)")
    deploy.set_defaults(run=deployments.cmd_deploy)
    dp = commands.add_parser("deployments", help="deployed models and their replicas")
    dpc = dp.add_subparsers(dest="deployments_command", required=True)
    _json_flag(dpc.add_parser("list", help="list deployments, newest first")).set_defaults(
        run=deployments.cmd_deployments_list
    )
    dp_get = dpc.add_parser("get", help="one deployment as JSON: status, error, replicas")
    dp_get.add_argument("id")
    dp_get.set_defaults(run=deployments.cmd_deployments_get)
    dp_delete = dpc.add_parser("delete", help="stop its replicas and remove it")
    dp_delete.add_argument("id")
    dp_delete.set_defaults(run=deployments.cmd_deployments_delete)
    ev = _json_flag(
        commands.add_parser("eval", help="compare a model with a baseline on a file, graded")
    )
    ev.add_argument("--model", required=True, help="an ft: model, an adapter or a served base")
    ev.add_argument("--baseline", required=True, help="the model to compare with")
    ev.add_argument("--file", required=True, help="a .jsonl (uploaded), a ds_ or file- id")
    ev.add_argument(
        "--grader", required=True, help="an OpenAI-style grader (.json) or reward functions (.py)"
    )
    ev.add_argument("--max-tokens", dest="max_tokens", type=int, help="per answer (256)")
    ev.add_argument("--no-wait", action="store_true", help="queue it and answer at once")
    ev.add_argument("--timeout", type=float, default=3600, help="seconds to wait (3600)")
    ev.set_defaults(run=evaluations.cmd_eval)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)  # usage errors exit 2 here
    try:
        if getattr(args, "needs_client", True):
            return args.run(args, Client(api_key=args.api_key, base_url=args.api_url))
        return args.run(args, Client)
    except train.BadConfig as exc:
        err.print(f"error: {exc}", highlight=False, markup=False)
        return 2
    except VeriAPIError as exc:
        err.print(f"error: {exc.message}", highlight=False, markup=False)
        if isinstance(exc, AuthenticationError) and exc.code != "missing_api_key":
            err.print(f"To use another key, {LOGIN_HINT}.", highlight=False, markup=False)
        return 1
    except KeyboardInterrupt:
        err.print("interrupted")
        return 1


if __name__ == "__main__":
    sys.exit(main())
