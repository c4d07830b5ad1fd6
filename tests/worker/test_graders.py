"""OpenAI's graders as Veri scores them: every kind and operation on known values, the errors an
invalid grader gets, the generated GRPO reward called as TRL calls it, and a python grader run on
the control plane's side, sandboxed, against hostile graders."""

import math
import os
import time

import pytest
from openai.types.fine_tuning.alpha import GraderRunResponse

from training.specs import check_reward_source
from worker import sandbox
from worker.errors import JobFailure
from worker.graders import (
    GraderError,
    check_grader,
    reward_grader,
    reward_source,
    run_isolated,
    run_response,
    sample_for,
    score,
)
from worker.train import load_rewards


def string_check(operation: str, input="{{sample.output_text}}", reference="{{item.answer}}"):
    return {
        "type": "string_check",
        "name": "check",
        "input": input,
        "reference": reference,
        "operation": operation,
    }


def similarity(metric: str, input="{{sample.output_text}}", reference="{{item.answer}}"):
    return {
        "type": "text_similarity",
        "name": "similar",
        "input": input,
        "reference": reference,
        "evaluation_metric": metric,
    }


def python(source: str, name: str = "code") -> dict:
    return {"type": "python", "name": name, "source": source}


def reward_of(grader: dict, output: str, **item) -> float:
    return score(grader, sample=sample_for(output), item=item)["reward"]


# --- string_check and templates


@pytest.mark.parametrize(
    ("operation", "output", "answer", "expected"),
    [
        ("eq", "Paris", "Paris", 1.0),
        ("eq", "paris", "Paris", 0.0),
        ("ne", "Lyon", "Paris", 1.0),
        ("ne", "Paris", "Paris", 0.0),
        ("like", "The capital is Paris.", "Paris", 1.0),
        ("like", "The capital is PARIS.", "Paris", 0.0),
        ("ilike", "The capital is PARIS.", "paris", 1.0),
        ("ilike", "The capital is Lyon.", "paris", 0.0),
    ],
)
def test_string_check_operations(operation, output, answer, expected):
    assert reward_of(string_check(operation), output, answer=answer) == expected


def test_templates_read_nested_item_fields_and_the_outputs_json():
    grader = string_check(
        "eq",
        input="{{ sample.output_json.city }}/{{sample.output_json.rank}}",
        reference="{{item.expected.cities[1]}}/{{ item.expected.ranks.0 }}",
    )
    item = {"expected": {"cities": ["Lyon", "Paris"], "ranks": [1]}}
    assert reward_of(grader, '{"city": "Paris", "rank": 1}', **item) == 1.0
    assert reward_of(grader, '{"city": "Lyon", "rank": 1}', **item) == 0.0


def test_sample_namespace():
    assert sample_for('{"a": [1, 2]}')["output_json"] == {"a": [1, 2]}
    sample = sample_for("not json")
    assert sample["output_text"] == "not json"
    assert sample["output_json"] is None
    assert sample["output_tools"] == []
    assert sample["choices"][0]["message"] == {"role": "assistant", "content": "not json"}


def test_a_missing_item_field_scores_zero_with_the_variable_error():
    result = score(string_check("eq"), sample=sample_for("Paris"), item={"other": 1})
    assert result["reward"] == 0.0
    assert result["errors"]["invalid_variable_error"] is True
    assert "item has no 'answer'" in result["error"]


# --- text_similarity


@pytest.mark.parametrize(
    ("metric", "output", "reference", "expected"),
    [
        # BLEU-4: precisions 5/6, 3/5, 2/4, 1/3, equal lengths: (1/12) ** (1/4)
        ("bleu", "the cat sat on a mat", "the cat sat on the mat", (1 / 12) ** 0.25),
        # every n-gram matches but the text is short: brevity penalty exp(1 - 6/4)
        ("bleu", "the cat sat on", "the cat sat on the mat", math.exp(-0.5)),
        ("bleu", "the mat", "the cat sat on the mat", 0.0),  # no 3- or 4-gram: 0, as NLTK
        # GLEU: 11 of 18 n-grams on either side
        ("gleu", "the cat sat on a mat", "the cat sat on the mat", 11 / 18),
        # METEOR, exact matches: P=1, R=4/5, 2 chunks over 4 matches
        ("meteor", "a b c d", "a b x c d", 0.8 / (0.9 + 0.08) * (1 - 0.5 * 0.5**3)),
        ("rouge_1", "The cat sat.", "the cat ran away", 4 / 7),
        ("rouge_2", "the cat sat", "the cat ran away", 0.4),
        ("rouge_l", "a b c d", "a c b d", 0.75),
        ("rouge_3", "same words here", "same words here", 1.0),
        ("fuzzy_match", "kitten", "kitten", 1.0),
    ],
)
def test_text_similarity_metrics(metric, output, reference, expected):
    assert reward_of(similarity(metric), output, answer=reference) == pytest.approx(expected)


def test_fuzzy_match_orders_by_closeness():
    grader = similarity("fuzzy_match")
    scores = [reward_of(grader, text, answer="kitten") for text in ("kitten", "sitting", "zzz")]
    assert scores[0] > scores[1] > scores[2] >= 0.0


# --- python and multi


def test_python_grader_reads_sample_and_item():
    grader = python(
        "def grade(sample, item):\n"
        "    return 1.0 if sample['output_json']['n'] == item['n'] else 0.25\n"
    )
    assert reward_of(grader, '{"n": 4}', n=4) == 1.0
    assert reward_of(grader, '{"n": 5}', n=4) == 0.25


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("    raise KeyError('x')", "KeyError"),
        ("    return 'high'", "not a number"),
        ("    return float('nan')", "returned nan"),
        ("    raise SystemExit(3)", "SystemExit"),
    ],
)
def test_a_failing_python_grader_scores_zero_with_the_runtime_error(body, message):
    result = score(python(f"def grade(sample, item):\n{body}\n"), sample=sample_for("x"), item={})
    assert result["reward"] == 0.0
    assert result["errors"]["python_grader_runtime_error"] is True
    assert message in result["errors"]["python_grader_runtime_error_details"]


MULTI = {
    "type": "multi",
    "name": "combined",
    "graders": {
        "exact": string_check("eq"),
        "overlap": similarity("bleu"),
    },
    "calculate_output": "0.5 * exact + 0.5 * overlap^2",
}


def test_multi_combines_its_graders_with_the_formula():
    result = score(
        MULTI, sample=sample_for("the cat sat on a mat"), item={"answer": "the cat sat on the mat"}
    )
    bleu = (1 / 12) ** 0.25
    assert result["sub_rewards"] == {"exact": 0.0, "overlap": pytest.approx(bleu)}
    assert result["reward"] == pytest.approx(0.5 * bleu**2)


def test_multi_formula_functions():
    grader = dict(MULTI, calculate_output="max(exact, overlap) - floor(overlap) + sqrt(4) / 2")
    assert reward_of(grader, "yes", answer="yes") == pytest.approx(2.0)
    grader = dict(MULTI, calculate_output="log(exact)")  # log(0)
    result = score(grader, sample=sample_for("no"), item={"answer": "yes"})
    assert (result["reward"], result["errors"]["other_error"]) == (0.0, True)


# --- invalid graders: the error names the field as OpenAI's `param` would

MULTI_OF = {"type": "multi", "name": "m", "calculate_output": "exact"}
BAD_GRADERS = [
    ("not a grader", "grader", "must be an object"),
    ({"type": "regex", "name": "x"}, "grader.type", "must be one of"),
    ({**string_check("eq"), "name": None}, "grader.name", "required"),
    (string_check("contains"), "grader.operation", "eq, ne, like, ilike"),
    (string_check("eq", input="{{foo.bar}}"), "grader.input", "`item` or `sample`"),
    (string_check("eq", reference="{{sample.text}}"), "grader.reference", "output_text"),
    (string_check("eq", input="{{item.a..b}}"), "grader.input", "not a valid template"),
    (similarity("cosine"), "grader.evaluation_metric", "embedding model"),
    (similarity("bleurt"), "grader.evaluation_metric", "must be one of"),
    (python("def score(sample, item):\n    return 1\n"), "grader.source", "def grade"),
    (python("def grade(sample, item):\n    return (\n"), "grader.source", "does not parse"),
    (python("def grade(sample):\n    return 1\n"), "grader.source", "two arguments"),
    (
        {"type": "score_model", "name": "judge", "model": "gpt-4o", "input": []},
        "grader.type",
        "needs a judge model",
    ),
    (
        {"type": "label_model", "name": "judge", "model": "x", "input": [], "labels": ["a"]},
        "grader.type",
        "needs a judge model",
    ),
    ({**MULTI_OF, "graders": {}}, "grader.graders", "named graders"),
    (
        {**MULTI_OF, "graders": {"exact": string_check("is")}},
        "grader.graders.exact.operation",
        "must be one of",
    ),
    (
        {**MULTI_OF, "graders": {"exact": {**MULTI_OF, "graders": {"e": string_check("eq")}}}},
        "grader.graders.exact.type",
        "cannot contain a multi",
    ),
    (
        {**MULTI_OF, "graders": {"exact": similarity("cosine")}},
        "grader.graders.exact.evaluation_metric",
        "embedding model",
    ),
]
BAD_FORMULAS = [
    "__import__('os').system('id')",
    "exact.real",
    "exact if exact else 1",
    "[exact][0]",
    "missing + 1",
    "min()",
    "abs(exact, exact)",
    "exact == 1",
    "'1' + exact",
    "open('x')",
    "(lambda: 1)()",
    "exact; 1",
]


@pytest.mark.parametrize(("grader", "param", "message"), BAD_GRADERS)
def test_invalid_graders_name_the_param(grader, param, message):
    with pytest.raises(GraderError) as raised:
        check_grader(grader)
    assert raised.value.param == param
    assert message in raised.value.message


@pytest.mark.parametrize("formula", BAD_FORMULAS)
def test_formulas_outside_the_whitelist_are_refused(formula):
    grader = {**MULTI_OF, "graders": {"exact": string_check("eq")}, "calculate_output": formula}
    with pytest.raises(GraderError) as raised:
        check_grader(grader)
    assert raised.value.param == "grader.calculate_output"


def test_a_single_grader_under_multi_is_named_by_its_name():
    grader = {**MULTI_OF, "graders": string_check("eq"), "calculate_output": "check * 2"}
    assert reward_of(grader, "Paris", answer="Paris") == 2.0


# --- run_response: OpenAI's GraderRunResponse


def test_run_response_is_openais_grader_run_response():
    response = run_response(MULTI, sample_for("yes"), {"answer": "yes"})
    parsed = GraderRunResponse.model_validate(response)
    assert parsed.reward == pytest.approx(0.5)
    assert parsed.metadata.name == "combined" and parsed.metadata.type == "multi"
    assert parsed.sub_rewards == {"exact": 1.0, "overlap": 0.0}
    assert parsed.metadata.errors.python_grader_runtime_error is False


# --- the GRPO reward: reward_source called as TRL calls it

ROWS = [
    {"messages": [{"role": "user", "content": "Capital of France?"}], "answer": "Paris"},
    {"messages": [{"role": "user", "content": "Capital of Italy?"}], "answer": "Rome"},
]
COMPLETIONS = ["Paris", "It is Rome, I think", "paris", "Milan"]
TRAINING_GRADERS = [
    string_check("ilike"),
    similarity("fuzzy_match"),
    {
        "type": "multi",
        "name": "both",
        "graders": {
            "exact": string_check("eq"),
            "code": python(
                "def grade(sample, item):\n"
                "    return float(item['messages'][0]['content'].endswith('?'))"
                " * len(sample['output_text']) / 20\n"
            ),
        },
        "calculate_output": "exact + code",
    },
]


def trl_call(reward, completions):
    """How TRL 1.16 calls a reward: the prompt column apart, the other columns as lists, and its
    own extras beside them (GRPOTrainer._calculate_rewards)."""
    rows = [ROWS[i % 2] for i in range(len(completions))]
    return reward(
        prompts=[row["messages"] for row in rows],
        completions=completions,
        completion_ids=[[1, 2, 3]] * len(completions),
        answer=[row["answer"] for row in rows],
        trainer_state=object(),
        log_extra=lambda *a, **k: None,
        log_metric=lambda *a, **k: None,
    )


@pytest.mark.parametrize("grader", TRAINING_GRADERS, ids=lambda g: g["type"])
def test_reward_source_scores_as_score_does(grader):
    source = reward_source(grader)
    check_reward_source(source)
    (reward,) = load_rewards(source)  # the worker's own loading, as in training
    expected = [
        score(grader, sample=sample_for(text), item=ROWS[i % 2])["reward"]
        for i, text in enumerate(COMPLETIONS)
    ]
    assert trl_call(reward, COMPLETIONS) == pytest.approx(expected)
    conversational = [[{"role": "assistant", "content": text}] for text in COMPLETIONS]
    assert trl_call(reward, conversational) == pytest.approx(expected)
    assert len(set(expected)) > 1


def test_reward_source_fails_the_job_when_rows_lack_a_field_the_grader_reads():
    (reward,) = load_rewards(reward_source(string_check("eq", reference="{{item.solution}}")))
    with pytest.raises(JobFailure) as raised:
        trl_call(reward, COMPLETIONS)
    assert "item has no 'solution'" in str(raised.value)


def test_reward_source_refuses_an_invalid_grader():
    with pytest.raises(GraderError):
        reward_source(similarity("cosine"))


REWARDS = """
from veri_sdk import reward_function


@reward_function
def says_the_answer(prompts, completions, answer, **kwargs):
    return [float(a in c) for c, a in zip(completions, answer)]


@reward_function
def short(prompts, completions, **kwargs):
    return [1.0 / (1 + len(c)) for c in completions]
"""


def test_a_reward_source_grades_as_training_calls_its_functions():
    """As a python grader, reward functions score one sample as TRL's call of the worker's own
    loaded functions scores it (text prompts: the completion as text; their scores added)."""
    grader = reward_grader(REWARDS)
    functions = load_rewards(REWARDS)
    for index, text in enumerate(COMPLETIONS):
        item = {"prompt": "What is 2 + 2?", **ROWS[index % 2]}
        columns = {key: [value] for key, value in item.items() if key != "prompt"}
        expected = sum(f([item["prompt"]], [text], **columns)[0] for f in functions)
        isolated = run_isolated(grader, sample=sample_for(text), item=item)
        assert isolated["error"] is None and isolated["reward"] == pytest.approx(expected)
    # A chat row: its messages are the prompt, the completion the assistant's message.
    chat = {"messages": [{"role": "user", "content": "2 + 2?"}], "answer": "4"}
    shapes = """
def reward(prompts, completions, messages, **kw):
    said = [[{"role": "assistant", "content": "4"}]]
    return [float(prompts == messages and completions == said)]
"""
    assert score(reward_grader(shapes), sample=sample_for("4"), item=chat)["reward"] == 1.0
    words = "def reward(prompts, completions, **kw):\n    return ['x']\n"
    broken = score(reward_grader(words), sample=sample_for("4"), item=chat)
    assert broken["reward"] == 0.0 and "not a number" in broken["error"]


# --- a python grader on the control plane: run_isolated


def isolated(source: str, timeout: float = 10.0, **item) -> tuple[dict, float]:
    started = time.monotonic()
    result = run_isolated(python(source), sample=sample_for("42"), item=item, timeout=timeout)
    return result, time.monotonic() - started


def assert_runtime_error(result: dict, message: str) -> None:
    assert result["reward"] == 0.0
    assert result["errors"]["python_grader_runtime_error"] is True
    assert message in result["errors"]["python_grader_runtime_error_details"]


def test_run_isolated_scores_a_python_grader():
    result, _ = isolated(
        "def grade(sample, item):\n    return int(sample['output_text']) / item['total']\n",
        total=84,
    )
    assert result["reward"] == 0.5
    assert result["error"] is None
    response = run_response(python("def grade(s, i):\n    return 1\n"), sample_for("x"), {})
    assert GraderRunResponse.model_validate(response).reward == 1.0


def test_an_endless_grader_times_out():
    result, elapsed = isolated("def grade(sample, item):\n    while True:\n        pass\n", 2)
    assert_runtime_error(result, "did not finish within 2 s")
    assert result["errors"]["unresponsive_reward_error"] is True
    assert elapsed < 8


def test_the_grader_sees_none_of_the_callers_environment(monkeypatch):
    monkeypatch.setenv("VERI_TEST_SECRET", "hunter2-graders")
    assert os.environ["VERI_TEST_SECRET"] == "hunter2-graders"
    scan = sandbox.isolated()  # as another user, this machine's processes are not to be read
    source = (
        "import glob, os\n"
        "def grade(sample, item):\n"
        "    found = 'VERI_TEST_SECRET' in os.environ\n"
        f"    if {scan}:\n"
        "        for path in glob.glob('/proc/*/environ'):\n"
        "            try:\n"
        "                found |= b'hunter2-graders' in open(path, 'rb').read()\n"
        "            except OSError:\n"
        "                pass\n"
        "    return 1.0 if found else 0.5\n"
    )
    result, _ = isolated(source)
    assert (result["reward"], result["error"]) == (0.5, None)


def test_a_grader_flooding_its_output_is_cut_short():
    source = (
        "import os, sys\n"
        "def grade(sample, item):\n"
        "    for fd in range(1, 10):\n"
        "        try:\n"
        "            os.write(fd, b'garbage' * 1_000_000)\n"
        "        except OSError:\n"
        "            pass\n"
        "    print('x' * 50_000_000)\n"
        "    return 1.0\n"
    )
    result, elapsed = isolated(source)
    assert_runtime_error(result, "python grader")
    assert elapsed < 8


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("import os\ndef grade(sample, item):\n    os._exit(3)\n", "exited with code 3"),
        ("def grade(sample, item):\n    raise ValueError('bad sample')\n", "bad sample"),
        ("def grade(sample, item):\n    return [1]\n", "not a number"),
        ("def grade(sample, item):\n    return bytearray(8 * 1024**3)\n", "MemoryError"),
    ],
)
def test_a_misbehaving_grader_gives_an_error_not_an_exception(source, message):
    result, _ = isolated(source)
    assert_runtime_error(result, message)


def test_an_isolated_grader_has_no_network():
    # The suite runs as root (CI does), where graders get the sandbox that cuts the network.
    assert sandbox.isolated(), "run the suite as root: only the root sandbox cuts the network"
    source = (
        "import socket\n"
        "def grade(sample, item):\n"
        "    socket.create_connection(('1.1.1.1', 53), timeout=2)\n"
        "    return 1.0\n"
    )
    result, _ = isolated(source)
    assert_runtime_error(result, "OSError")
