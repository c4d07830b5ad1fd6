"""`veri eval` against a live control plane (no task cluster here: the evaluation stays queued;
tests/e2e/test_evaluations.py runs one to the end and reads its printed summary)."""

import json
import threading
import time
from functools import partialmethod

import pytest
from django.db import connection

from billing.services import open_billing_account
from serving.models import Evaluation
from serving.services import evaluations
from serving.services.deployments import Shape, create_deployment
from tests.openai_api.conftest import jsonl
from tests.serving.test_evaluations import BASE, CHAT, EXACT, OTHER
from training.models import Dataset
from veri_sdk.evaluations import Evaluations

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def files(cli, tmp_path, settings, local_store_url):
    settings.VERI_STORE = local_store_url
    open_billing_account(workspace=cli.workspace, credit_micros=100_000_000)  # deploying needs it
    for base in (BASE, OTHER):
        create_deployment(workspace=cli.workspace, base_model=base, adapters=[], shape=Shape())
    (tmp_path / "held_out.jsonl").write_bytes(jsonl([CHAT]))
    (tmp_path / "grader.json").write_text(json.dumps(EXACT))
    (tmp_path / "bad.json").write_text(json.dumps({**EXACT, "operation": "sounds_like"}))
    (tmp_path / "broken.json").write_text("{not json")
    return tmp_path


def evaluate(cli, capsys, files, grader: str, *more: str):
    return cli(
        "eval",
        "--model",
        BASE,
        "--baseline",
        OTHER,
        "--file",
        str(files / "held_out.jsonl"),
        "--grader",
        str(files / grader),
        *more,
        capsys=capsys,
    )


def test_eval_uploads_the_file_and_queues_the_comparison(cli, capsys, files):
    code, out, err = evaluate(cli, capsys, files, "grader.json", "--no-wait")
    assert code == 0, err
    assert "queued" in out and f"{cli.url}/evaluations/eval_" in out
    more = ("--no-wait", "--json", "--max-tokens", "9")
    code, out, err = evaluate(cli, capsys, files, "grader.json", *more)
    evaluation = json.loads(out)
    assert (evaluation["model"], evaluation["baseline"], evaluation["status"]) == (
        BASE,
        OTHER,
        "queued",
    )
    assert evaluation["file"].startswith("ds_") and evaluation["grader"] == EXACT
    assert evaluation["max_tokens"] == 9


def test_eval_says_what_is_wrong_with_the_grader(cli, capsys, files):
    code, _, err = evaluate(cli, capsys, files, "bad.json", "--no-wait")
    assert code == 1 and "grader.operation must be one of" in err
    # The file it uploaded for the refused evaluation is deleted again; one the workspace
    # already had is kept.
    assert not Dataset.objects.filter(workspace=cli.workspace).exists()
    code, _, _ = cli("datasets", "upload", str(files / "held_out.jsonl"), capsys=capsys)
    assert code == 0
    code, _, err = evaluate(cli, capsys, files, "bad.json", "--no-wait")
    assert code == 1 and Dataset.objects.filter(workspace=cli.workspace).count() == 1
    code, _, err = evaluate(cli, capsys, files, "broken.json", "--no-wait")
    assert code == 2 and "cannot read the grader" in err


def test_a_model_name_with_colons_is_printed_as_typed(cli, capsys, files):
    model = "ft:not:deployed:x:1"
    code, _, err = cli(
        "eval",
        "--model",
        model,
        "--baseline",
        OTHER,
        "--file",
        str(files / "held_out.jsonl"),
        "--grader",
        str(files / "grader.json"),
        "--no-wait",
        capsys=capsys,
    )
    assert code == 1 and repr(model) in err and "❌" not in err


POLL = 0.5  # seconds between veri eval's looks at the evaluation here (2 s by default)
SEVERAL_POLLS = 6 * POLL  # for veri eval to see a change, on a busy machine too


def answer_in_the_background(workspace) -> threading.Thread:
    """Plays the task cluster for the next evaluation of `workspace` (none runs here): answers
    its first row, leaves `veri eval` several polls to see that, then answers the rest, leaves it
    several polls to see that too (scoring can end the evaluation within one), and scores them with
    run_evaluation (the grader in its sandboxed child)."""

    def work():
        try:
            deadline = time.monotonic() + 60
            while not (found := Evaluation.objects.filter(workspace=workspace).first()):
                assert time.monotonic() < deadline, "no evaluation was created"
                time.sleep(0.1)
            found.samples.filter(index=0).update(model_output="plum", baseline_output="pear")
            time.sleep(SEVERAL_POLLS)
            found.samples.update(model_output="plum", baseline_output="pear")
            time.sleep(SEVERAL_POLLS)
            evaluations.run_evaluation(evaluation_id=found.pk)
        finally:
            connection.close()

    thread = threading.Thread(target=work, daemon=True)
    thread.start()
    return thread


def test_eval_shows_progress_and_fails_when_the_grader_scores_nothing(
    cli, capsys, files, monkeypatch
):
    monkeypatch.setattr(Evaluations, "wait", partialmethod(Evaluations.wait, poll=POLL))
    (files / "reward.py").write_text("def reward(prompts, completions, **kwargs):\n    return 1\n")
    (files / "held_out.jsonl").write_bytes(jsonl([CHAT, CHAT]))
    worker = answer_in_the_background(cli.workspace)
    code, out, err = evaluate(cli, capsys, files, "reward.py", "--timeout", "120")
    worker.join(timeout=60)
    assert "answered 1/2, scored 0/2" in err and "answered 2/2, scored 0/2" in err
    assert code == 1 and "grader_failed" in out
    assert "must return a list of numbers, one per completion; it returned int" in out
