"""`python -m worker run --job ID --api URL`, with the job token in VERI_JOB_TOKEN."""

import argparse
import sys

from worker.runner import run


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m worker")
    commands = parser.add_subparsers(dest="command", required=True)
    run_parser = commands.add_parser("run", help="run one training job")
    run_parser.add_argument("--job", required=True)
    run_parser.add_argument(
        "--api", required=True, help="the control plane, e.g. https://veri.example.com"
    )
    args = parser.parse_args()
    return run(job_id=args.job, api_url=args.api)


if __name__ == "__main__":
    sys.exit(main())
