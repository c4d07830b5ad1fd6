"""Evaluations' API: what a bad request is told (Veri's error format, naming the field), the
rows each file format asks, workspace scoping, and the summary's arithmetic. The end-to-end run
(models answering, the grader scoring) is tests/e2e/test_evaluations.py."""

import math
from datetime import timedelta

import pytest
from django.utils import timezone

from billing.services import open_billing_account
from serving.models import Evaluation
from serving.services import evaluations
from serving.services.deployments import Shape, create_deployment
from tests.conftest import assert_error
from tests.training.conftest import upload_dataset
from veri.models import Workspace

pytestmark = pytest.mark.django_db
BASE = "Qwen/Qwen2.5-0.5B"
OTHER = "Qwen/Qwen2.5-1.5B"
EXACT = {
    "type": "string_check",
    "name": "exact",
    "input": "{{ sample.output_text }}",
    "reference": "{{ item.reference }}",
    "operation": "eq",
}
CHAT = {
    "messages": [
        {"role": "user", "content": "Name a fruit."},
        {"role": "assistant", "content": "plum"},
    ]
}


@pytest.fixture
def served(billed, settings, local_store_url) -> dict:
    """Two served bases (their replicas written, never launched: nothing commits here) and an
    uploaded chat file."""
    settings.VERI_STORE = local_store_url
    for base in (BASE, OTHER):
        create_deployment(workspace=billed, base_model=base, adapters=[], shape=Shape())
    return {"model": BASE, "baseline": OTHER, "grader": EXACT, "max_tokens": 8}


def create(api_client, body: dict, rows: list[dict] | None = None):
    if "file" not in body:
        body = {**body, "file": upload_dataset(api_client, rows or [CHAT])["id"]}
    return api_client.post("/v1/evaluations", body, format="json")


BAD = [
    ({"model": None}, 400, "invalid_request", "model"),
    ({"model": "ft:nobody:deployed:this"}, 400, "model_not_found", "model"),
    ({"baseline": "Qwen/Qwen3-8B"}, 400, "model_not_found", "baseline"),
    ({"file": "ds_nothere"}, 404, "not_found", "file"),
    ({"file": "file-nothere"}, 404, "not_found", "file"),
    ({"grader": "exact"}, 400, "invalid_grader", "grader"),
    ({"grader": {**EXACT, "operation": "sounds_like"}}, 400, "invalid_grader", "grader.operation"),
    ({"grader": {**EXACT, "reference": "{{ env.SECRET }}"}}, 400, "invalid_grader", None),
    ({"grader": {"type": "python", "name": "g", "source": "x ="}}, 400, "invalid_grader", None),
    ({"grader": None}, 400, "invalid_request", "grader"),  # neither a grader nor a reward
    (
        {"reward_source": "def reward(completions, **kw):\n    return [1.0]\n"},
        400,
        "invalid_request",
        "grader",
    ),
    (
        {"grader": None, "reward_source": "def score(x): pass"},
        400,
        "invalid_reward",
        "reward_source",
    ),
    ({"grader": None, "reward_source": "def reward(:"}, 400, "invalid_reward", "reward_source"),
    ({"max_tokens": 0}, 400, "invalid_request", "max_tokens"),
    ({"temperature": -1}, 400, "invalid_request", "temperature"),
]


@pytest.mark.parametrize(("change", "status", "code", "field"), BAD)
def test_a_bad_request_names_its_field(api_client, served, change, status, code, field):
    body = {k: v for k, v in {**served, **change}.items() if v is not None}
    error = assert_error(create(api_client, body), status, code)
    assert error["field"] == field or (field is None and error["field"].startswith("grader."))
    assert not Evaluation.objects.exists()


def test_a_row_that_asks_nothing_is_refused_by_its_line(api_client, served):
    rows = [CHAT, {"text": "just text, no prompt"}]
    error = assert_error(create(api_client, served, rows), 400, "invalid_request", "file")
    assert "Line 2" in error["message"]


def test_each_format_asks_its_prompt_and_the_grader_reads_the_row(api_client, served):
    rows = [
        CHAT,  # OpenAI chat, ending with the held-out answer
        {"messages": [{"role": "user", "content": "Say hi."}], "reference": "hi"},
        {"prompt": "2 + 2 =", "answer": "4"},  # Veri text prompt: /v1/completions
    ]
    created = create(api_client, served, rows)
    assert created.status_code == 201, created.json()
    evaluation = created.json()
    assert evaluation["status"] == "queued" and evaluation["summary"] is None
    assert evaluation["id"].startswith("eval_") and evaluation["max_tokens"] == 8
    assert evaluation["temperature"] == 0  # greedy unless asked otherwise
    assert (evaluation["samples_total"], evaluation["samples_scored"]) == (3, 0)

    page = api_client.get(f"/v1/evaluations/{evaluation['id']}", {"limit": 2}).json()
    assert [s["index"] for s in page["samples"]["data"]] == [0, 1]
    first, second = page["samples"]["data"]
    assert first["prompt"] == CHAT["messages"][:1]
    assert first["item"] == {"messages": CHAT["messages"][:1], "reference": "plum"}
    assert first["model_output"] is None and first["model_score"] is None
    assert second["item"]["reference"] == "hi"  # the row's own reference
    rest = api_client.get(
        f"/v1/evaluations/{evaluation['id']}", {"cursor": page["samples"]["next_cursor"]}
    ).json()["samples"]
    assert [(s["prompt"], s["item"]) for s in rest["data"]] == [("2 + 2 =", rows[2])]
    assert rest["next_cursor"] is None


def test_reward_functions_grade_through_a_python_grader(api_client, served):
    source = "def reward(prompts, completions, **kwargs):\n    return [1.0] * len(completions)\n"
    body = {k: v for k, v in served.items() if k != "grader"} | {"reward_source": source}
    evaluation = create(api_client, body).json()
    assert evaluation["reward_source"] == source and evaluation["grader"]["type"] == "python"


def test_another_workspace_sees_no_evaluation(api_client, other_api_client, served):
    evaluation = create(api_client, served).json()
    path = f"/v1/evaluations/{evaluation['id']}"
    assert api_client.get(path).status_code == 200
    assert_error(other_api_client.get(path), 404, "not_found")
    assert other_api_client.get("/v1/evaluations").json()["data"] == []
    assert [e["id"] for e in api_client.get("/v1/evaluations").json()["data"]] == [evaluation["id"]]
    # Nor can it evaluate on this workspace's file with models of its own.
    theirs = Workspace.objects.get(name="other")
    open_billing_account(workspace=theirs, credit_micros=100_000_000)
    for base in (BASE, OTHER):
        create_deployment(workspace=theirs, base_model=base, adapters=[], shape=Shape())
    body = {**served, "file": evaluation["file"]}
    response = other_api_client.post("/v1/evaluations", body, format="json")
    assert_error(response, 404, "not_found", "file")


def test_the_summary_follows_from_the_scores():
    scores = [1.0, 0.0, 1.0, 1.0]
    found = evaluations.mean_interval(scores)
    half = 1.959963984540054 * math.sqrt(0.25) / 2  # s = 0.5 over n = 4
    assert found == pytest.approx({"mean": 0.75, "ci_low": 0.75 - half, "ci_high": 0.75 + half})
    assert evaluations.mean_interval([0.4]) == {"mean": 0.4, "ci_low": 0.4, "ci_high": 0.4}


def test_an_evaluation_that_lost_its_task_is_queued_again_once(api_client, served):
    evaluation = Evaluation.objects.get(public_id=create(api_client, served).json()["id"])
    now = timezone.now()
    assert evaluations.resume_stalled(now=now) == 0  # just queued: its task is on its way
    later = now + timedelta(seconds=evaluations.STALLED_SECONDS + 1)
    assert evaluations.resume_stalled(now=later) == 1
    assert evaluations.resume_stalled(now=later) == 0  # claimed: queued once
    Evaluation.objects.filter(pk=evaluation.pk).update(status="succeeded")
    assert evaluations.resume_stalled(now=later + timedelta(hours=1)) == 0


def answered(evaluation_id: str, model_output: str, baseline_output: str) -> Evaluation:
    """The evaluation with every sample answered (no replica runs here): only scoring is left,
    which run_evaluation does in the grader's sandboxed child as it would after answering."""
    evaluation = Evaluation.objects.get(public_id=evaluation_id)
    evaluation.samples.update(model_output=model_output, baseline_output=baseline_output)
    evaluations.run_evaluation(evaluation_id=evaluation.pk)
    evaluation.refresh_from_db()
    return evaluation


def test_an_evaluation_the_grader_could_score_nothing_of_fails(api_client, served):
    source = "def reward(prompts, completions, **kwargs):\n    return 1\n"
    body = {k: v for k, v in served.items() if k != "grader"} | {"reward_source": source}
    created = create(api_client, body, [CHAT, CHAT]).json()
    evaluation = answered(created["id"], "plum", "pear")
    assert (evaluation.status, evaluation.error_code) == ("failed", "grader_failed")
    assert "could not score 4 of 4 answers" in evaluation.error_message
    assert (
        "the reward function reward must return a list of numbers, one per completion; "
        "it returned int" in evaluation.error_message
    )
    shown = api_client.get(f"/v1/evaluations/{created['id']}").json()
    assert shown["summary"] is None and shown["samples_scored"] == 0
    assert shown["samples_answered"] == 2 and "Fix the grader" in shown["error"]["hint"]


def test_answers_the_grader_could_not_score_are_left_out(api_client, served):
    # The second row has no reference: the grader cannot score either answer to it.
    rows = [CHAT, CHAT, {"messages": [{"role": "user", "content": "Hi."}]}]
    created = create(api_client, served, rows).json()
    evaluation = answered(created["id"], "plum", "pear")
    assert evaluation.status == "succeeded"
    summary = evaluation.summary
    assert (summary["samples"], summary["unscored_answers"]) == (2, 2)
    assert "reference" in summary["first_grader_error"]
    assert summary["model"]["mean"] == 1.0 and summary["baseline"]["mean"] == 0.0
    assert summary["win_rate"] == 1.0
    assert api_client.get(f"/v1/evaluations/{created['id']}").json()["samples_scored"] == 2


def test_the_interval_stays_within_the_scores_there_can_be(api_client, served):
    fig = {"messages": [{"role": "user", "content": "Name a fig."}], "reference": "fig"}
    created = create(api_client, served, [CHAT, CHAT, CHAT, fig]).json()
    summary = answered(created["id"], "plum", "pear").summary
    model = summary["model"]  # scores 1, 1, 1, 0: mean ± 0.49 would reach 1.24
    assert model["mean"] == 0.75 and model["ci_high"] == 1.0 and 0.0 < model["ci_low"] < 0.75
    # A grader's own range bounds it where it gives one.
    scores = [0.5, 0.5, 0.5, 1.0]
    assert evaluations.score_bounds({"range": [0, 1]}, scores) == (0.0, 1.0)
    assert evaluations.score_bounds(EXACT, scores) == (0.5, 1.0)
    assert evaluations.mean_interval(scores, (0.5, 1.0))["ci_low"] == 0.5
