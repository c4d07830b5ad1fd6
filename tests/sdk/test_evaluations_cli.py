"""`veri eval` against a live control plane (no task cluster here: the evaluation stays queued;
tests/e2e/test_evaluations.py runs one to the end and reads its printed summary)."""

import json

import pytest

from billing.services import open_billing_account
from serving.services.deployments import Shape, create_deployment
from tests.openai_api.conftest import jsonl
from tests.serving.test_evaluations import BASE, CHAT, EXACT, OTHER

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
