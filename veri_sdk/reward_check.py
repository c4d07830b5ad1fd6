"""Run a GRPO reward on this machine before renting a GPU: `veri rewards test` (and `veri train`)
start `python -m veri_sdk.reward_check FILE --dataset ROWS -n N` as a child with a time limit and
read the JSON it prints. The reward is called as the worker calls it, on the dataset's prompts
with sample completions, in batches."""

import argparse
import json
import math
import runpy
import sys
import time
import traceback
from pathlib import Path

BATCH = 8  # completions per call, as a rollout group would be
SYNTHETIC = ["", "a", "The answer is 42.", "I do not know.", "Yes, because it is so.", "aaaa"]


def find_reward(namespace: dict):
    """The function a worker would call: one marked by the decorators, else `reward`."""
    marked = [v for v in namespace.values() if callable(v) and getattr(v, "__veri_reward__", 0)]
    return marked[0] if marked else namespace.get("reward")


def as_text(value) -> str:
    if isinstance(value, list) and value and isinstance(value[-1], dict):
        return str(value[-1].get("content", ""))
    return value if isinstance(value, str) else json.dumps(value)


def samples(rows: list[dict], count: int) -> list[tuple[dict, str]]:
    """(row, completion) pairs: the row's own `completion` or `chosen` when it has one, else a
    short synthetic completion."""
    picked = []
    for index in range(count):
        row = rows[index % len(rows)] if rows else {"prompt": "Say something."}
        own = row.get("completion", row.get("chosen"))
        picked.append((row, as_text(own) if own is not None else SYNTHETIC[index % len(SYNTHETIC)]))
    return picked


def problems_with(scores, expected: int) -> list[str]:
    if not isinstance(scores, list | tuple):
        return [f"it returned a {type(scores).__name__}, not a list of numbers"]
    found = []
    if len(scores) != expected:
        found.append(f"it returned {len(scores)} scores for {expected} completions")
    for index, score in enumerate(scores):
        if isinstance(score, bool) or not isinstance(score, int | float):
            found.append(f"score {index} is a {type(score).__name__} ({score!r:.40}), not a number")
            break
        if not math.isfinite(score):
            found.append(f"score {index} is {score}")
            break
    return found


def check(reward_file: Path, rows: list[dict], count: int) -> dict:
    report: dict = {"calls": [], "problems": [], "error": None, "function": None}
    try:
        namespace = runpy.run_path(str(reward_file), run_name="veri_reward")
    except BaseException as exc:  # noqa: BLE001 - the customer's module; report, never crash
        report["error"] = {
            "type": type(exc).__name__,
            "message": str(exc),
            "traceback": traceback.format_exc(),
        }
        return report
    function = find_reward(namespace)
    if function is None:
        report["problems"].append("no reward function: define `reward(...)` or decorate one")
        return report
    report["function"] = getattr(function, "__name__", "reward")
    pairs = samples(rows, count)
    for start in range(0, len(pairs), BATCH):
        batch = pairs[start : start + BATCH]
        columns = {
            key: [row.get(key) for row, _ in batch]
            for key in {k for row, _ in batch for k in row}
            if key != "prompt"
        }
        prompts = [row.get("prompt") for row, _ in batch]
        completions = [completion for _, completion in batch]
        began = time.perf_counter()
        try:
            scores = function(prompts=prompts, completions=completions, **columns)
        except BaseException as exc:  # noqa: BLE001 - what the worker would report
            report["error"] = {
                "type": type(exc).__name__,
                "message": str(exc),
                "traceback": traceback.format_exc(),
            }
            return report
        seconds = time.perf_counter() - began
        report["calls"].append(
            {
                "prompts": [as_text(p)[:200] for p in prompts],
                "completions": [c[:200] for c in completions],
                "scores": [s if isinstance(s, int | float) else repr(s) for s in scores]
                if isinstance(scores, list | tuple)
                else repr(scores)[:200],
                "returned": type(scores).__name__,
                "seconds": seconds,
            }
        )
        if problems := problems_with(scores, len(batch)):
            report["problems"] += problems
            return report
    return report


def read_rows(path: str | None) -> list[dict]:
    if not path:
        return []
    rows = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        if line.strip():
            row = json.loads(line)
            if isinstance(row, dict):
                rows.append(row)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m veri_sdk.reward_check")
    parser.add_argument("file")
    parser.add_argument("--dataset")
    parser.add_argument("-n", type=int, default=16)
    args = parser.parse_args()
    report = check(Path(args.file), read_rows(args.dataset), max(1, args.n))
    print(json.dumps(report, default=repr))
    return 0


if __name__ == "__main__":
    sys.exit(main())
