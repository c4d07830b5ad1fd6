"""Compare on a file: a deployed fine-tune of the tiny model and its base answer every row of a
held-out file through the inference router, a grader scores each answer in its sandboxed child,
and every score equals the grader called directly on that (row, output): against a live server,
a real task cluster and the local provider. Then the dashboard's page of it, and `veri eval`
(waking the deployment, scaled to zero meanwhile) scoring with a reward function, each score the
function's own."""

import html
import math
import time

import pytest
from django_q.tasks import async_task

from serving import tasks
from serving.models import Evaluation, EvaluationSample, EvaluationStatus
from tests.conftest import assert_error
from tests.dashboard.conftest import member_of, signed_in
from tests.e2e.test_serving import (  # noqa: F401 - fixtures
    TOKENS,
    deployed_fine_tune,
    idle_past_its_timeout,
    platform,
    wait_deployment,
)
from tests.openai_api.conftest import jsonl
from veri_sdk.cli import main
from worker import graders

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True, serialized_rollback=True)]

REFERENCE = "plum plum plum is a fruit."
QUESTIONS = ["Name a fruit.", "What is red?", "Say a word.", "What grows on trees?"]
ROWS = [
    {
        "messages": [
            {"role": "user", "content": question},
            {"role": "assistant", "content": REFERENCE},
        ]
    }
    for question in QUESTIONS
]
# Half the reference's words said, half how close the whole answer is: a python grader (customer
# code, run in the sandboxed child) and a text metric, combined.
WORDS = """
def grade(sample, item):
    said = sample["output_text"].split()
    wanted = item["reference"].split()
    return sum(word in said for word in wanted) / len(wanted)
"""
GRADER = {
    "type": "multi",
    "name": "close_to_reference",
    "graders": {
        "words": {"type": "python", "name": "words", "source": WORDS},
        "fuzzy": {
            "type": "text_similarity",
            "name": "fuzzy",
            "input": "{{ sample.output_text }}",
            "reference": "{{ item.reference }}",
            "evaluation_metric": "fuzzy_match",
        },
    },
    "calculate_output": "0.5 * words + 0.5 * fuzzy",
}


# The same closeness as a GRPO reward function: the share of the reference's words said.
REWARD = """
def reward(prompts, completions, reference, **kwargs):
    scores = []
    for completion, wanted in zip(completions, reference):
        said = completion[-1]["content"].split()
        scores.append(sum(word in said for word in wanted.split()) / len(wanted.split()))
    return scores
"""


def wait_evaluation(api_client, evaluation_id: str, timeout: float = 600) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        evaluation = api_client.get(f"/v1/evaluations/{evaluation_id}", {"limit": 200}).json()
        if evaluation["status"] in ("succeeded", "failed"):
            return evaluation
        time.sleep(1)
    raise AssertionError(f"{evaluation_id} still {evaluation['status']} after {timeout} s")


def interval(scores: list[float]) -> tuple[float, float, float]:
    n, mean = len(scores), sum(scores) / len(scores)
    half = 1.959963984540054 * math.sqrt(sum((s - mean) ** 2 for s in scores) / (n - 1) / n)
    # kept within the scores given (the grader has no `range`)
    return mean, max(mean - half, min(scores)), min(mean + half, max(scores))


def test_every_score_is_the_graders_own_and_the_summary_follows(
    deployed_fine_tune,  # noqa: F811
    live_server,
    api_client,
    other_api_client,
    workspace,
    monkeypatch,
    capsys,
    tmp_path,
):
    client, model = deployed_fine_tune.client, deployed_fine_tune.model
    base = deployed_fine_tune.deployment["base_model"]
    held_out = client.files.create(file=("held_out.jsonl", jsonl(ROWS)), purpose="fine-tune")
    body = {
        "model": model,
        "baseline": base,
        "file": held_out.id,
        "grader": GRADER,
        "max_tokens": TOKENS,
    }
    created = api_client.post("/v1/evaluations", body, format="json")
    assert created.status_code == 201, created.json()
    evaluation = wait_evaluation(api_client, created.json()["id"])
    assert evaluation["status"] == "succeeded", evaluation["error"]
    samples = evaluation["samples"]["data"]
    assert evaluation["samples_total"] == evaluation["samples_scored"] == len(ROWS)
    assert [s["index"] for s in samples] == list(range(len(ROWS)))

    for sample, row in zip(samples, ROWS, strict=True):
        asked = row["messages"][:1]
        assert sample["prompt"] == asked
        assert sample["item"] == {"messages": asked, "reference": REFERENCE}
        for side, name in (("model", model), ("baseline", base)):
            output = sample[f"{side}_output"]
            # The answer the client itself gets, greedy, from the same deployment.
            direct = client.chat.completions.create(
                model=name, messages=asked, temperature=0, max_tokens=TOKENS
            )
            assert output == direct.choices[0].message.content
            # The score the grader itself gives that answer on that row.
            scored = graders.score(GRADER, sample=graders.sample_for(output), item=sample["item"])
            assert scored["error"] is None and sample[f"{side}_grader_error"] == ""
            assert sample[f"{side}_score"] == scored["reward"]
    ours = [s["model_score"] for s in samples]
    theirs = [s["baseline_score"] for s in samples]
    assert ours != theirs  # the fine-tune answers differently from its base

    summary = evaluation["summary"]
    for side, scores in (("model", ours), ("baseline", theirs)):
        assert tuple(summary[side].values()) == pytest.approx(interval(scores))
    wins = sum(m > b for m, b in zip(ours, theirs, strict=True))
    ties = sum(m == b for m, b in zip(ours, theirs, strict=True))
    assert (summary["wins"], summary["ties"]) == (wins, ties)
    assert summary["win_rate"] == pytest.approx((wins + ties / 2) / len(ROWS))
    assert_error(other_api_client.get(f"/v1/evaluations/{evaluation['id']}"), 404, "not_found")

    # The task again: a finished evaluation is left as it is; one cut short mid-sample answers
    # only what it lacks, into the same rows.
    stored = Evaluation.objects.get(public_id=evaluation["id"])
    assert tasks.run_evaluation(evaluation_id=stored.pk) == "finished already"
    Evaluation.objects.filter(pk=stored.pk).update(status=EvaluationStatus.RUNNING, summary={})
    EvaluationSample.objects.filter(evaluation=stored, index=1).update(
        baseline_output=None, baseline_score=None
    )
    assert tasks.run_evaluation(evaluation_id=stored.pk) == "succeeded"
    again = api_client.get(f"/v1/evaluations/{evaluation['id']}", {"limit": 200}).json()
    assert again["samples"]["data"] == samples and again["summary"] == summary
    assert EvaluationSample.objects.filter(evaluation=stored).count() == len(ROWS)

    # The dashboard's page: the summary, and both outputs side by side with their scores.
    owner = signed_in(member_of(workspace, "owner@acme.test"))
    page = html.unescape(owner.get(f"/evaluations/{evaluation['id']}/").content.decode())
    assert f"{len(ROWS)} of {len(ROWS)} samples scored" in page
    assert f"{wins} wins, {ties} ties (counted half)" in page
    for sample in samples:
        assert f'data-output="model">{sample["model_output"]}<' in page
        assert f'data-output="baseline">{sample["baseline_output"]}<' in page
    assert evaluation["id"] in owner.get("/evaluations/").content.decode()

    # Scaled to zero meanwhile: the next evaluation wakes the deployment, as a request does.
    path = f"/v1/deployments/{deployed_fine_tune.deployment['id']}"
    api_client.patch(path, {"idle_timeout_seconds": 10}, format="json")
    idle_past_its_timeout(deployed_fine_tune.deployment["id"])
    async_task("serving.tasks.watch_deployments")
    wait_deployment(api_client, deployed_fine_tune.deployment["id"], "stopped", timeout=60)

    # `veri eval` on a local file, scored by a reward function: the same answers (greedy), each
    # scored as a GRPO job's reward function scores it; the summary printed.
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("VERI_API_URL", live_server.url)
    monkeypatch.setenv("VERI_API_KEY", api_client.raw_key)
    (tmp_path / "held_out.jsonl").write_bytes(jsonl(ROWS))
    (tmp_path / "reward.py").write_text(REWARD)
    capsys.readouterr()
    code = main(
        [
            "eval",
            "--model",
            model,
            "--baseline",
            base,
            "--file",
            str(tmp_path / "held_out.jsonl"),
            "--grader",
            str(tmp_path / "reward.py"),
            "--max-tokens",
            str(TOKENS),
        ]
    )
    printed = capsys.readouterr()
    assert code == 0, printed.err
    by_cli = api_client.get("/v1/evaluations").json()["data"][0]  # newest first
    assert by_cli["id"] != evaluation["id"] and by_cli["status"] == "succeeded"
    cli_samples = api_client.get(f"/v1/evaluations/{by_cli['id']}", {"limit": 200}).json()
    namespace: dict = {}
    exec(REWARD, namespace)
    for sample, first in zip(cli_samples["samples"]["data"], samples, strict=True):
        for side in ("model", "baseline"):
            output = sample[f"{side}_output"]
            assert output == first[f"{side}_output"]
            completion = [{"role": "assistant", "content": output}]
            [expected] = namespace["reward"](
                prompts=[first["prompt"]],
                completions=[completion],
                messages=[first["prompt"]],
                reference=[REFERENCE],
            )
            assert sample[f"{side}_score"] == expected
    summary = by_cli["summary"]
    for side in ("model", "baseline"):
        found = summary[side]
        half = (found["ci_high"] - found["ci_low"]) / 2
        assert f"{found['mean']:.3f} ± {half:.3f}" in printed.out
    assert f"win rate {summary['win_rate']:.1%}" in printed.out
    assert "ties counted half" in printed.out
    assert f"{live_server.url}/evaluations/{by_cli['id']}/" in printed.out
    assert api_client.get(path).json()["status"] == "ready"  # woken
