"""Serving on the embedded default, one run, three ways, measured the same way (the same chat
prompts, max_tokens, greedy, the text's tokens counted with the model's own tokenizer):

- the gateway: `POST /v1/chat/completions` with `stream=True` on the web server as deployed
  (gunicorn, gthread, docs/deploy.md), routed to the deployment's replica;
- the serving process directly (the replica's own URL, no gateway);
- `model.generate` in a plain script (transformers, the same chat template, greedy).

Time to first token is from sending the request (for the plain script: from applying the chat
template) to the first non-empty text; output tokens/s is the answer's tokens over the whole
request. Ratios are printed of the best of each way (its own cost, on a shared machine) and of
the medians. Then `--clients` concurrent streaming clients through the gateway and then directly:
the TTFT the gateway adds at p50 and p99, and how long a plain API call (`GET /v1/deployments`)
takes while those streams hold the web server's threads (it waits only when no thread is free).

    .venv/bin/python -m bench.serving [--prompts 4] [--max-tokens 64] [--repeat 3] \
        [--clients 20] [--workers 4] [--threads 16]

The embedded default (SQLite, local store, local provider, the worker's CPU engine on the tiny
model made here); its serving process answers one request at a time, so concurrent requests
queue there, through the gateway or not, and the difference is the gateway's.
"""

import argparse
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

from bench.common import MANAGE, REPO, embedded_env, free_port, new_workspace, tiny_model, wait_for

PROMPTS = [
    "What is the answer?",
    "Is the model good or bad?",
    "Train the model on the data, step by step.",
    "What equals two plus two?",
    "Say yes or no.",
    "Tell me about the reward.",
    "What is a good step?",
    "Is the data bad?",
]

# model.generate in a plain script, greedy, timed as the servers are: from the chat template to
# the first non-empty text (a streamer sees each token as it is generated) and to the end.
PLAIN = """
import json, sys, time
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.generation.streamers import BaseStreamer
model_dir, prompts, max_tokens = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
tokenizer = AutoTokenizer.from_pretrained(model_dir)
model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
class Stamp(BaseStreamer):
    def __init__(self, start):
        self.start, self.ids, self.first, self.prompt_seen = start, [], None, False
    def put(self, value):
        if not self.prompt_seen:
            self.prompt_seen = True
            return
        self.ids += value.flatten().tolist()
        if self.first is None and tokenizer.decode(self.ids, skip_special_tokens=True):
            self.first = time.perf_counter() - self.start
    def end(self):
        pass
def one(prompt):
    start = time.perf_counter()
    ids = tokenizer.apply_chat_template([{"role": "user", "content": prompt}],
        add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
    stamp = Stamp(start)
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=max_tokens, do_sample=False,
            streamer=stamp, pad_token_id=tokenizer.pad_token_id)
    text = tokenizer.decode(out[0, len(ids):], skip_special_tokens=True)
    return {"ttft": stamp.first, "total": time.perf_counter() - start, "text": text}
one(prompts[0])  # untimed warm-up
print("RESULT", json.dumps([one(p) for p in prompts]))
"""


def stream(client: httpx.Client, url: str, prompt: str, max_tokens: int, headers: dict) -> dict:
    """One streamed chat completion: its time to first text, whole time, and text."""
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
    }
    start, first, text = time.perf_counter(), None, []
    with client.stream("POST", url, json=body, headers=headers) as response:
        answered = time.perf_counter() - start
        if response.status_code != 200:
            raise SystemExit(f"{url} answered {response.status_code}: {response.read()[:300]}")
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if "error" in event:
                raise SystemExit(f"{url} streamed an error: {event}")
            for choice in event.get("choices", []):
                piece = choice.get("delta", {}).get("content") or ""
                if piece and first is None:
                    first = time.perf_counter() - start
                text.append(piece)
    return {
        "ttft": first,
        "total": time.perf_counter() - start,
        "text": "".join(text),
        "headers": answered,
        "sent": start,
    }


MODEL = "volume://models/tiny"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def spread(values: list[float], unit: str = "") -> str:
    return f"{statistics.median(values):.3f}{unit} ({min(values):.3f}-{max(values):.3f})"


def concurrent(clients: int, work) -> list[dict]:
    """`work(i)` in `clients` threads released together."""
    barrier, results = threading.Barrier(clients), [None] * clients

    def run(index):
        barrier.wait()
        results[index] = work(index)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--prompts", type=int, default=4, help=f"of {len(PROMPTS)}")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=3, help="rounds, the three ways in turn")
    parser.add_argument("--clients", type=int, default=20, help="concurrent streaming clients")
    parser.add_argument("--workers", type=int, default=4, help="gunicorn workers")
    parser.add_argument("--threads", type=int, default=16, help="gunicorn threads per worker")
    args = parser.parse_args()
    prompts = PROMPTS[: args.prompts]
    work = Path(tempfile.mkdtemp(prefix="veri-serving-"))
    port = free_port()
    api = f"http://127.0.0.1:{port}"
    env = embedded_env(work, port)
    key = new_workspace(env, "bench", "--credit", "1000")
    model = tiny_model(env, work / "tiny")
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)

    def tokens(text: str) -> int:
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])

    web = [
        str(Path(sys.executable).parent / "gunicorn"),
        "config.wsgi:application",
        "--bind",
        f"127.0.0.1:{port}",
        "--worker-class",
        "gthread",
        "--workers",
        str(args.workers),
        "--threads",
        str(args.threads),
        "--timeout",
        "120",
    ]
    processes = [
        subprocess.Popen(web, env=env, cwd=REPO, stderr=subprocess.DEVNULL),
        subprocess.Popen(
            [*MANAGE, "qcluster"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        ),
    ]
    try:
        wait_for(f"{api}/v1/schema", 60)
        from veri_sdk import Client

        veri = Client(api_key=key, base_url=api)
        veri.volumes.create("models")
        veri.volumes.upload_dir("models", model, prefix="tiny")
        deployment = veri.deployments.create(
            base_model=MODEL, min_replicas=1, idle_timeout_seconds=3600
        )
        deployment = veri.deployments.wait_ready(deployment["id"], timeout=300)
        if deployment["status"] != "ready":
            raise SystemExit(f"the deployment did not start: {deployment['error']}")
        with sqlite3.connect(work / "db.sqlite3") as db:
            [(replica,)] = db.execute("select url from serving_replica where status = 'ready'")
        auth = {"Authorization": f"Bearer {key}"}
        ways = {
            "gateway": lambda c, p: stream(
                c, f"{api}/v1/chat/completions", p, args.max_tokens, auth
            ),
            "direct": lambda c, p: stream(
                c, f"{replica}/v1/chat/completions", p, args.max_tokens, {}
            ),
        }
        runs: dict[str, list[dict]] = {"plain": [], "direct": [], "gateway": []}
        with httpx.Client(timeout=120) as client:
            for way in ways.values():  # untimed: the first request of each pays for warming up
                way(client, prompts[0])
            for round_ in range(args.repeat):
                plain = subprocess.run(
                    [
                        sys.executable,
                        "-c",
                        PLAIN,
                        str(model),
                        json.dumps(prompts),
                        str(args.max_tokens),
                    ],
                    env=env,
                    capture_output=True,
                    text=True,
                    check=True,
                )
                runs["plain"] += json.loads(plain.stdout.split("RESULT ", 1)[1])
                for name, way in ways.items():
                    runs[name] += [way(client, p) for p in prompts]
                print(f"round {round_ + 1}/{args.repeat} done", flush=True)

        texts = {name: [r["text"] for r in found] for name, found in runs.items()}
        same = texts["plain"] == texts["direct"] == texts["gateway"]
        rates = {
            name: [tokens(r["text"]) / r["total"] for r in found] for name, found in runs.items()
        }
        ttfts = {name: [r["ttft"] for r in found if r["ttft"]] for name, found in runs.items()}
        counted = statistics.mean(tokens(t) for t in texts["plain"])

        # Concurrent streams: through the gateway, then directly, the same requests.
        def through(url: str, headers: dict):
            def work(index: int) -> dict:
                with httpx.Client(timeout=300) as client:
                    return stream(
                        client, url, prompts[index % len(prompts)], args.max_tokens, headers
                    )

            return work

        probes: list[float] = []

        def probe_while_streaming(done: threading.Event) -> None:
            time.sleep(0.3)  # the streams are all open by now, most waiting at the replica
            while not done.is_set():
                start = time.perf_counter()
                httpx.get(f"{api}/v1/deployments", headers=auth, timeout=300)
                probes.append(time.perf_counter() - start)
                time.sleep(0.2)

        done = threading.Event()
        prober = threading.Thread(target=probe_while_streaming, args=(done,))
        prober.start()
        gateway = concurrent(args.clients, through(f"{api}/v1/chat/completions", auth))
        done.set()
        prober.join()
        direct = concurrent(args.clients, through(f"{replica}/v1/chat/completions", {}))
    finally:
        for process in processes:
            process.terminate()
            process.wait()

    print(
        f"\nServing the tiny Qwen2 on the embedded default (CPU engine), {len(prompts)} prompts x "
        f"{args.repeat} rounds, max_tokens {args.max_tokens}, greedy; {counted:.1f} output "
        f"tokens per answer; the three ways gave the same text: {same}"
    )
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(
        f"  gunicorn gthread, {args.workers} workers x {args.threads} threads; load average "
        f"{load} on {os.cpu_count()} CPUs"
    )
    print(f"  {'':22s} {'output tokens/s':>26s} {'time to first token, s':>26s}")
    for name, label in (
        ("plain", "model.generate script"),
        ("direct", "serving process"),
        ("gateway", "through the API"),
    ):
        print(f"  {label:22s} {spread(rates[name]):>26s} {spread(ttfts[name]):>26s}")
    # On a shared machine the best of each way is its own cost; the median carries the load.
    for label, rate, ttft in (
        ("best", max, min),
        ("medians", statistics.median, statistics.median),
    ):
        r = {n: rate(v) for n, v in rates.items()}
        t = {n: ttft(v) for n, v in ttfts.items()}
        print(
            f"  ratios ({label}): tokens/s direct/plain {r['direct'] / r['plain']:.2f}, "
            f"gateway/plain {r['gateway'] / r['plain']:.2f}, "
            f"gateway/direct {r['gateway'] / r['direct']:.2f}; TTFT gateway-direct "
            f"{(t['gateway'] - t['direct']) * 1000:.1f} ms"
        )
    g = [r["ttft"] for r in gateway]
    d = [r["ttft"] for r in direct]
    print(f"  {args.clients} concurrent streaming clients (they queue at the one serving process):")
    print(
        f"    TTFT p50 gateway {percentile(g, 50):.3f} s, direct {percentile(d, 50):.3f} s: "
        f"added {(percentile(g, 50) - percentile(d, 50)) * 1000:.0f} ms; p99 gateway "
        f"{percentile(g, 99):.3f} s, direct {percentile(d, 99):.3f} s: added "
        f"{(percentile(g, 99) - percentile(d, 99)) * 1000:.0f} ms"
    )
    if probes:
        print(
            f"    GET /v1/deployments while they streamed: {len(probes)} calls, median "
            f"{statistics.median(probes) * 1000:.0f} ms, max {max(probes) * 1000:.0f} ms "
            f"(a call waiting for a free thread would take as long as a stream)"
        )


if __name__ == "__main__":
    main()
