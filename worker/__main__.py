"""`python -m worker run --job ID --api URL`, with the job token in VERI_JOB_TOKEN; `python -m
worker serve --replica ID --api URL [--engine vllm --tensor-parallel-size N --max-loras N]`, a
deployment's serving process, with the replica token in VERI_REPLICA_TOKEN; `python -m worker
tinker --model ID --api URL [--sampler vllm]`, a Tinker training client's model, with the model
token in VERI_TINKER_TOKEN."""

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
    serve_parser = commands.add_parser("serve", help="serve a deployment's models (one replica)")
    serve_parser.add_argument("--replica", required=True)
    serve_parser.add_argument("--api", required=True, help="the control plane")
    serve_parser.add_argument(
        "--engine",
        choices=["cpu", "vllm"],
        default="cpu",
        help="cpu: transformers + PEFT in this process; vllm: vLLM's server (a GPU machine)",
    )
    serve_parser.add_argument("--tensor-parallel-size", type=int, default=1, help="vllm: GPUs")
    serve_parser.add_argument("--max-loras", type=int, default=1, help="vllm: adapter slots")
    tinker_parser = commands.add_parser("tinker", help="hold one Tinker training client's model")
    tinker_parser.add_argument("--model", required=True)
    tinker_parser.add_argument("--api", required=True, help="the control plane")
    tinker_parser.add_argument(
        "--sampler",
        choices=["transformers", "vllm"],
        default="transformers",
        help="transformers: in this process; vllm: vLLM's server beside it (a GPU machine)",
    )
    args = parser.parse_args()
    if args.command == "serve":
        from worker.serve import serve  # torch loads only where a model is served

        return serve(
            replica_id=args.replica,
            api_url=args.api,
            engine=args.engine,
            tensor_parallel_size=args.tensor_parallel_size,
            max_loras=args.max_loras,
        )
    if args.command == "tinker":
        from worker.tinker import serve_model

        return serve_model(model_id=args.model, api_url=args.api, sampler=args.sampler)
    return run(job_id=args.job, api_url=args.api)


if __name__ == "__main__":
    sys.exit(main())
