"""`veri eval`: compare a model with a baseline on a held-out file, and print who won."""

import json
from pathlib import Path

from veri_sdk.cli.output import err, out, print_json, print_table, table
from veri_sdk.cli.train import BadConfig


def _scoring(path: str) -> dict:
    """A `.py` file is reward functions' source; anything else a JSON grader object."""
    try:
        text = Path(path).read_text()
        return {"reward_source": text} if path.endswith(".py") else {"grader": json.loads(text)}
    except (OSError, ValueError) as exc:
        raise BadConfig(f"cannot read the grader {path}: {exc}") from None


def _interval(side: dict) -> str:
    half = (side["ci_high"] - side["ci_low"]) / 2
    return f"{side['mean']:.3f} ± {half:.3f}"


def print_summary(evaluation: dict, *, base_url: str) -> None:
    summary = evaluation["summary"]
    listing = table("", "MODEL", "MEAN ± 95% CI", "CI", whole=("MODEL",))
    for side in ("model", "baseline"):
        found = summary[side]
        ci = f"[{found['ci_low']:.3f}, {found['ci_high']:.3f}]"
        listing.add_row(side, evaluation[side], _interval(found), ci)
    print_table(listing)
    out.print(
        f"win rate {summary['win_rate']:.1%} over {summary['samples']} samples "
        f"({summary['wins']} wins, {summary['ties']} ties counted half, {summary['losses']} "
        "losses)",
        highlight=False,
        markup=False,
    )
    if summary.get("unscored_answers"):
        out.print(
            f"{summary['unscored_answers']} answer(s) could not be scored and are left out; the "
            f"grader's first error: {summary['first_grader_error']}",
            highlight=False,
        )
    out.print(
        f"Per-sample table: {base_url}/evaluations/{evaluation['id']}/ "
        f"(or GET /v1/evaluations/{evaluation['id']})",
        highlight=False,
        markup=False,
    )


def _progress_printer():
    """Prints where the evaluation stands on stderr, each time that changes (stdout stays the
    summary's)."""
    shown = None

    def show(evaluation: dict) -> None:
        nonlocal shown
        total, scored = evaluation["samples_total"], evaluation["samples_scored"]
        line = (
            f"{evaluation['id']} {evaluation['status']}: answered "
            f"{evaluation['samples_answered']}/{total}, scored {scored}/{total}"
        )
        if line != shown:
            err.print(line, highlight=False)
            shown = line

    return show


def cmd_eval(args, client) -> int:
    evaluation = client.evaluations.create(
        model=args.model,
        baseline=args.baseline,
        file=args.file,
        **_scoring(args.grader),
        max_tokens=args.max_tokens,
    )
    if not args.no_wait:
        progress = None if args.json else _progress_printer()
        evaluation = client.evaluations.wait(
            evaluation["id"], timeout=args.timeout, on_progress=progress
        )
    evaluation.pop("samples", None)
    if args.json:
        print_json(evaluation)
        return 0 if evaluation["status"] != "failed" else 1
    if evaluation["status"] == "failed":
        error = evaluation["error"]
        out.print(
            f"{evaluation['id']} failed: {error['code']}: {error['message']} {error['hint']}",
            highlight=False,
            markup=False,
        )
        return 1
    if evaluation["status"] != "succeeded":
        out.print(
            f"{evaluation['id']} {evaluation['status']}: veri eval does not wait with "
            f"--no-wait; see {client.base_url}/evaluations/{evaluation['id']}/",
            highlight=False,
            markup=False,
        )
        return 0
    print_summary(evaluation, base_url=client.base_url)
    return 0
