"""OpenAI's fine-tuning graders as Veri rewards: `string_check`, `text_similarity`, `python` and
`multi` score a model sample against a dataset item, as OpenAI documents them.

Where each kind runs, and why:
- A reinforcement job's grader becomes its GRPO `reward_source` (`reward_source`): a few lines
  that call `score` on every completion inside the training process, which the worker already
  runs sandboxed as customer code (worker/sandbox.py). A `python` grader's `source` runs there,
  exactly where and how a Veri reward function runs.
- `POST /v1/fine_tuning/alpha/graders/run` goes through `run_response`: every grader is scored by
  `run_isolated` (a grader without code runs none, but its templates multiply the item and its
  metrics are quadratic in the texts: a request's worth of either would hold or exhaust the API
  process), in a child process (`python -m worker.grader_run`) in the same sandbox as the
  training process when the control plane runs as root (its own user id, no network, only the
  system, Python and the worker package visible), always with an empty environment, a wall-clock
  timeout, memory, CPU, file-size and output limits. Customer code never runs in the API process.
- `score_model` and `label_model` need a judge model, and `text_similarity`'s `cosine` an
  embedding model: none is served by this deployment yet, so `check_grader` refuses them.

Templates: `{{ item.field }}` (nested: `item.a.b`, `item.list[0]` or `item.list.0`) reads the
dataset row; `{{ sample.output_text }}`, `{{ sample.output_json.x }}`, `{{ sample.output_tools }}`
and `{{ sample.choices }}` read the model's sample. Strings are inserted as they are, other values
as JSON. An unknown namespace or sample field is refused by `check_grader`; an item field missing
from a row is an `invalid_variable_error` when scoring.
"""

import ast
import copy
import functools
import json
import math
import re
import sys
import time

from worker.grader_metrics import METRICS

KINDS = ("string_check", "text_similarity", "python", "multi", "score_model", "label_model")
OPERATIONS = ("eq", "ne", "like", "ilike")
EVALUATION_METRICS = ("cosine", *METRICS)
SAMPLE_FIELDS = ("output_text", "output_json", "output_tools", "choices")
PYTHON_SOURCE_CHARS = 256 * 1024  # OpenAI's limit on a python grader's source
FORMULA_CHARS = 1024
# calculate_output's functions: (function, least and most arguments).
FUNCTIONS = {
    "min": (lambda *a: min(a), 1, 64),
    "max": (lambda *a: max(a), 1, 64),
    "abs": (abs, 1, 1),
    "floor": (math.floor, 1, 1),
    "ceil": (math.ceil, 1, 1),
    "exp": (math.exp, 1, 1),
    "sqrt": (math.sqrt, 1, 1),
    "log": (math.log, 1, 2),
}
OPERATORS = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.Div: lambda a, b: a / b,
    ast.Pow: math.pow,  # a float or an error: never a complex, never a huge integer
}
# OpenAI's GraderRunResponse.metadata.errors: every flag, all clear.
NO_ERRORS = {
    "formula_parse_error": False,
    "invalid_variable_error": False,
    "model_grader_parse_error": False,
    "model_grader_refusal_error": False,
    "model_grader_server_error": False,
    "model_grader_server_error_details": None,
    "other_error": False,
    "python_grader_runtime_error": False,
    "python_grader_runtime_error_details": None,
    "python_grader_server_error": False,
    "python_grader_server_error_type": None,
    "sample_parse_error": False,
    "truncated_observation_error": False,
    "unresponsive_reward_error": False,
}
# What TRL passes a reward function besides the dataset's columns (trl 1.16 GRPOTrainer).
TRL_EXTRAS = {"completion_ids", "trainer_state", "log_extra", "log_metric", "environments"}


class GraderError(ValueError):
    """An invalid grader: `param` is the dotted path into the request OpenAI would name."""

    def __init__(self, message: str, *, param: str = "grader"):
        super().__init__(message)
        self.message, self.param = message, param


class _Failure(Exception):
    """Scoring failed: `flag` is the metadata.errors flag it raises; `of_item` when a template
    named a field the dataset row lacks (a data error, whatever the model wrote)."""

    def __init__(self, flag: str, message: str, *, of_item: bool = False):
        super().__init__(message)
        self.flag, self.message, self.of_item = flag, message, of_item


def sample_for(completion_text: str) -> dict:
    """The `sample` namespace for one model output: its text, the text parsed as JSON when it is
    valid JSON (else None), its tool calls (none for a plain text) and the chat-completions
    `choices` it would have come as."""
    try:
        parsed = json.loads(completion_text)
    except (ValueError, RecursionError):
        parsed = None
    message = {"role": "assistant", "content": completion_text}
    return {
        "output_text": completion_text,
        "output_json": parsed,
        "output_tools": [],
        "choices": [{"index": 0, "finish_reason": "stop", "message": message}],
    }


def _completion_sample(completion) -> dict:
    """The sample for a completion as TRL hands it over: a string, or for a conversational
    prompt a list of messages (their text joined; their tool calls as output_tools)."""
    if isinstance(completion, str):
        return sample_for(completion)
    texts, tools = [], []
    for message in completion if isinstance(completion, list) else []:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, str):
            texts.append(content)
        elif isinstance(content, list):
            texts += [p.get("text", "") for p in content if isinstance(p, dict)]
        tools += (message.get("tool_calls") or []) if isinstance(message, dict) else []
    sample = sample_for("".join(texts))
    sample["output_tools"] = tools
    sample["choices"][0]["message"]["tool_calls"] = tools
    return sample


# --- templates

TEMPLATE = re.compile(r"\{\{(.*?)\}\}", re.DOTALL)
REFERENCE = re.compile(r"([A-Za-z_]\w*)((?:\.[^.\[\]\s]+|\[\d+\])*)")
STEP = re.compile(r"\.([^.\[\]\s]+)|\[(\d+)\]")


def _reference(text: str, param: str) -> tuple[str, list[str]]:
    """`item.a[0].b` as ("item", ["a", "0", "b"]); GraderError if it names no known variable."""
    text = text.strip()
    found = REFERENCE.fullmatch(text)
    if not found:
        raise GraderError(f"{{{{ {text} }}}} is not a valid template reference.", param=param)
    namespace = found.group(1)
    steps = [key or index for key, index in STEP.findall(found.group(2))]
    if namespace not in ("item", "sample"):
        raise GraderError(
            f"{{{{ {text} }}}}: templates read the `item` or `sample` namespace, not "
            f"{namespace!r}.",
            param=param,
        )
    if namespace == "sample" and (not steps or steps[0] not in SAMPLE_FIELDS):
        raise GraderError(
            f"{{{{ {text} }}}}: the sample namespace has {', '.join(SAMPLE_FIELDS)}.", param=param
        )
    return namespace, steps


def _check_template(template, param: str) -> None:
    if not isinstance(template, str):
        raise GraderError(f"{param} must be a string.", param=param)
    for found in TEMPLATE.finditer(template):
        _reference(found.group(1), param)


def _lookup(namespace: str, steps: list[str], value):
    walked = namespace
    for step in steps:
        if isinstance(value, dict) and step in value:
            value = value[step]
        elif isinstance(value, list) and step.isdigit() and int(step) < len(value):
            value = value[int(step)]
        else:
            raise _Failure(
                "invalid_variable_error",
                f"{{{{ {namespace}.{'.'.join(steps)} }}}}: {walked} has no {step!r}.",
                of_item=namespace == "item",
            )
        walked += f".{step}"
    return value


def render(template: str, *, sample: dict, item: dict) -> str:
    """The template with every `{{ namespace.path }}` replaced by its value."""

    def value(found: re.Match) -> str:
        namespace, steps = _reference(found.group(1), "grader")
        resolved = _lookup(namespace, steps, sample if namespace == "sample" else item)
        return resolved if isinstance(resolved, str) else json.dumps(resolved)

    return TEMPLATE.sub(value, template)


# --- checking a grader (no customer code runs: `ast` only)


def _text(grader: dict, key: str, at: str) -> str:
    if not isinstance(grader.get(key), str):
        raise GraderError(f"{at}.{key} is required and must be a string.", param=f"{at}.{key}")
    return grader[key]


def _check_python(source: str, at: str) -> None:
    param = f"{at}.source"
    if len(source) > PYTHON_SOURCE_CHARS:
        raise GraderError(f"{param} is longer than {PYTHON_SOURCE_CHARS} characters.", param=param)
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        message = f"{param} does not parse: line {exc.lineno}: {exc.msg}."
        raise GraderError(message, param=param) from None
    except (ValueError, RecursionError, MemoryError) as exc:
        raise GraderError(f"{param} does not parse: {exc}.", param=param) from None
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == "grade":
            args = node.args
            positional = len(args.posonlyargs) + len(args.args)
            required = positional - len(args.defaults)
            kw_required = sum(d is None for d in args.kw_defaults)
            if (positional >= 2 or args.vararg) and required <= 2 and not kw_required:
                return
            raise GraderError(
                f"{param}: grade must take two arguments, grade(sample, item).", param=param
            )
    raise GraderError(
        f"{param} must define a top-level function `def grade(sample, item) -> float`.",
        param=param,
    )


def _parse_formula(formula: str, names: set[str], param: str) -> ast.Expression:
    """calculate_output as an expression of numbers, sub-grader names, + - * / and ** (or ^, as
    OpenAI writes power) and FUNCTIONS; anything else is refused before anything is evaluated."""
    if len(formula) > FORMULA_CHARS:
        raise GraderError(f"{param} is longer than {FORMULA_CHARS} characters.", param=param)
    try:
        tree = ast.parse(formula.replace("^", "**").strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        raise GraderError(f"{param} is not a formula: {formula!r}.", param=param) from None
    allowed = (ast.Expression, ast.BinOp, ast.UnaryOp, ast.Constant, ast.Name, ast.Call, ast.Load)
    called = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = getattr(node.func, "id", None)
            if name not in FUNCTIONS or node.keywords:
                raise GraderError(
                    f"{param}: the functions are {', '.join(FUNCTIONS)}, called with numbers.",
                    param=param,
                )
            least, most = FUNCTIONS[name][1:]
            if not least <= len(node.args) <= most or any(
                isinstance(a, ast.Starred) for a in node.args
            ):
                raise GraderError(
                    f"{param}: {name}() takes {least} to {most} arguments.", param=param
                )
            called.add(id(node.func))
        elif isinstance(node, ast.Name) and node.id not in names and id(node) not in called:
            raise GraderError(
                f"{param} names {node.id!r}, which is not one of the graders "
                f"({', '.join(sorted(names)) or 'none'}).",
                param=param,
            )
        elif isinstance(node, ast.Constant) and (
            isinstance(node.value, bool) or not isinstance(node.value, int | float)
        ):
            raise GraderError(f"{param}: {node.value!r} is not a number.", param=param)
        elif isinstance(node, ast.BinOp | ast.UnaryOp):
            if type(node.op) not in OPERATORS and not isinstance(node.op, ast.UAdd | ast.USub):
                raise GraderError(f"{param}: the operators are + - * / and ^.", param=param)
        elif not isinstance(node, allowed + (ast.operator, ast.unaryop)):
            raise GraderError(f"{param} is not a formula: {formula!r}.", param=param)
    return tree


def _sub_graders(grader: dict, at: str) -> dict[str, dict]:
    """A multi grader's graders by the names its formula uses: OpenAI documents an object of
    name → grader; the client's types also allow one grader, named by its `name`."""
    graders = grader.get("graders")
    if isinstance(graders, dict) and isinstance(graders.get("type"), str):
        return {str(graders.get("name")): graders}
    if not isinstance(graders, dict) or not graders:
        raise GraderError(
            f"{at}.graders must be an object of named graders.", param=f"{at}.graders"
        )
    return graders


def check_grader(grader: dict, *, at: str = "grader") -> None:
    """Raise GraderError unless `grader` is a grader this deployment can score. Runs nothing."""
    if not isinstance(grader, dict):
        raise GraderError(f"{at} must be an object.", param=at)
    kind = grader.get("type")
    if kind not in KINDS:
        raise GraderError(
            f"{at}.type must be one of {', '.join(KINDS)}; got {kind!r}.", param=f"{at}.type"
        )
    if kind in ("score_model", "label_model"):
        raise GraderError(
            f"A {kind} grader needs a judge model; not available on this deployment until "
            "serving is configured.",
            param=f"{at}.type",
        )
    _text(grader, "name", at)
    if kind == "string_check":
        for key in ("input", "reference"):
            _check_template(_text(grader, key, at), f"{at}.{key}")
        if grader.get("operation") not in OPERATIONS:
            raise GraderError(
                f"{at}.operation must be one of {', '.join(OPERATIONS)}.", param=f"{at}.operation"
            )
    elif kind == "text_similarity":
        for key in ("input", "reference"):
            _check_template(_text(grader, key, at), f"{at}.{key}")
        metric = grader.get("evaluation_metric")
        if metric not in EVALUATION_METRICS:
            raise GraderError(
                f"{at}.evaluation_metric must be one of {', '.join(EVALUATION_METRICS)}.",
                param=f"{at}.evaluation_metric",
            )
        if metric == "cosine":
            raise GraderError(
                "The cosine metric needs an embedding model; none is served by this deployment. "
                "Use fuzzy_match, bleu, gleu, meteor or a rouge metric.",
                param=f"{at}.evaluation_metric",
            )
    elif kind == "python":
        _check_python(_text(grader, "source", at), at)
    else:
        if at != "grader":
            raise GraderError("A multi grader cannot contain a multi grader.", param=f"{at}.type")
        graders = _sub_graders(grader, at)
        for name, sub in graders.items():
            check_grader(sub, at=f"{at}.graders.{name}")
        _parse_formula(
            _text(grader, "calculate_output", at), set(graders), f"{at}.calculate_output"
        )


def runs_code(grader: dict) -> bool:
    """Whether scoring `grader` runs customer code (a python grader, or a multi holding one)."""
    if grader.get("type") == "multi":
        return any(runs_code(sub) for sub in _sub_graders(grader, "grader").values())
    return grader.get("type") == "python"


# --- scoring


@functools.lru_cache(maxsize=8)
def _python_grade(source: str):
    """The customer's `grade`, its module run once per process (customer code: see the module
    docstring for which processes may call this)."""
    namespace = {"__name__": "veri_grader"}
    exec(compile(source, "grader.py", "exec"), namespace)
    return namespace["grade"]


def _number(value, what: str) -> float:
    if not isinstance(value, int | float):
        shown = repr(value)[:60]
        raise _Failure(
            "python_grader_runtime_error",
            f"{what} returned a {type(value).__name__} ({shown}), not a number.",
        )
    if not math.isfinite(value):
        raise _Failure("python_grader_runtime_error", f"{what} returned {value}.")
    return float(value)


def _evaluate(node: ast.AST, values: dict[str, float]) -> float:
    if isinstance(node, ast.Expression):
        return _evaluate(node.body, values)
    if isinstance(node, ast.Constant):
        return float(node.value)
    if isinstance(node, ast.Name):
        return values[node.id]
    if isinstance(node, ast.UnaryOp):
        operand = _evaluate(node.operand, values)
        return -operand if isinstance(node.op, ast.USub) else operand
    if isinstance(node, ast.BinOp):
        left, right = _evaluate(node.left, values), _evaluate(node.right, values)
        return float(OPERATORS[type(node.op)](left, right))
    function = FUNCTIONS[node.func.id][0]
    return float(function(*(_evaluate(a, values) for a in node.args)))


def _grade(grader: dict, sample: dict, item: dict, sub_rewards: dict) -> float:
    kind = grader["type"]
    if kind == "string_check":
        given = render(grader["input"], sample=sample, item=item)
        expected = render(grader["reference"], sample=sample, item=item)
        operation = grader["operation"]
        if operation == "eq":
            return float(given == expected)
        if operation == "ne":
            return float(given != expected)
        if operation == "like":
            return float(expected in given)
        return float(expected.casefold() in given.casefold())
    if kind == "text_similarity":
        given = render(grader["input"], sample=sample, item=item)
        expected = render(grader["reference"], sample=sample, item=item)
        return float(METRICS[grader["evaluation_metric"]](given, expected))
    if kind == "python":
        try:
            grade = _python_grade(grader["source"])
            value = grade(copy.deepcopy(sample), copy.deepcopy(item))
        except (Exception, SystemExit) as exc:  # customer code: whatever it raises is its error
            raise _Failure("python_grader_runtime_error", f"{type(exc).__name__}: {exc}") from None
        return _number(value, "grade")
    graders = _sub_graders(grader, "grader")
    for name, sub in graders.items():
        sub_rewards[name] = _grade(sub, sample, item, {})
    formula = _parse_formula(grader["calculate_output"], set(graders), "calculate_output")
    try:
        reward = _evaluate(formula, sub_rewards)
    except (ArithmeticError, ValueError, RecursionError) as exc:  # 1024 characters nest deep
        raise _Failure("other_error", f"calculate_output failed: {exc}.") from None
    if not math.isfinite(reward):
        raise _Failure("other_error", f"calculate_output gave {reward}.")
    return reward


def _score(grader: dict, sample: dict, item: dict) -> tuple[dict, _Failure | None]:
    check_grader(grader)
    sub_rewards: dict[str, float] = {}
    errors = dict(NO_ERRORS)
    try:
        reward = _grade(grader, sample, item, sub_rewards)
        failure = None
    except _Failure as exc:
        reward, failure = 0.0, exc
        errors[exc.flag] = True
        if exc.flag == "python_grader_runtime_error":
            errors["python_grader_runtime_error_details"] = exc.message
    result = {
        "reward": reward,
        "sub_rewards": sub_rewards,
        "errors": errors,
        "error": failure.message if failure else None,
    }
    return result, failure


def score(grader: dict, *, sample: dict, item: dict) -> dict:
    """`{"reward", "sub_rewards", "errors", "error"}`: `errors` is OpenAI's metadata.errors flags,
    `error` a message when one is set (the reward is then 0). GraderError if the grader is
    invalid. Runs a python grader's code in this process: call it in the training process or the
    grader_run child only (`run_response` decides for the API)."""
    return _score(grader, sample, item)[0]


def run_response(grader: dict, sample: dict, item: dict, *, timeout: float = 10.0) -> dict:
    """OpenAI's GraderRunResponse for `grader` on `sample` and `item`, scored in `run_isolated`'s
    sandboxed child, within its time and memory limits."""
    check_grader(grader)
    started = time.monotonic()
    result = run_isolated(grader, sample=sample, item=item, timeout=timeout)
    return {
        "reward": result["reward"],
        "metadata": {
            "name": grader["name"],
            "type": grader["type"],
            "errors": result["errors"],
            "execution_time": time.monotonic() - started,
            "scores": dict(result["sub_rewards"]),
            "token_usage": None,
            "sampled_model_name": None,
        },
        "sub_rewards": result["sub_rewards"],
        "model_grader_token_usage_per_model": {},
    }


# --- in training: the grader as a GRPO reward


def reward_scores(grader: dict, *, prompts: list, completions: list, columns: dict) -> list[float]:
    """One reward per completion, as TRL calls a reward function: `columns` are the dataset's
    other fields (lists, one value per completion) and TRL's extras, which are left out. A
    failed score is 0 and its message is printed to the training's log; a template naming an
    item field the row lacks fails the job (no completion could ever be scored)."""
    rows = len(completions)
    fields = {
        key: value
        for key, value in columns.items()
        if key not in TRL_EXTRAS and isinstance(value, list | tuple) and len(value) == rows
    }
    rewards, reported = [], set()
    for index, completion in enumerate(completions):
        item = {key: value[index] for key, value in fields.items()}
        # TRL takes the prompt column away; the grader sees the row as the customer wrote it.
        prompt = prompts[index]
        item.setdefault("messages" if isinstance(prompt, list) else "prompt", prompt)
        result, failure = _score(grader, _completion_sample(completion), item)
        if failure and failure.of_item:
            raise GraderError(f"The dataset row does not fit the grader: {failure.message}")
        if failure and failure.message not in reported:
            reported.add(failure.message)
            print(f"grader {grader['name']!r} scored 0: {failure.message}", file=sys.stderr)
        rewards.append(result["reward"])
    return rewards


REWARD_SOURCE = '''"""The reward of an OpenAI-style grader: Veri wrote it from the job's grader."""

import json

from worker.graders import reward_scores

GRADER = json.loads({grader!r})


def reward(prompts, completions, **kwargs):
    return reward_scores(GRADER, prompts=prompts, completions=completions, columns=kwargs)
'''


def reward_source(grader: dict) -> str:
    """A GRPO job's reward_source scoring each completion with `grader` (checked first)."""
    check_grader(grader)
    return REWARD_SOURCE.format(grader=json.dumps(grader, sort_keys=True))


# --- a GRPO reward function as a python grader (to score samples as training would)


def reward_functions(namespace: dict) -> list:
    """The reward functions a reward source defined in `namespace`: every one marked with
    @reward_function (or @training_job), else `reward`. TRL adds their scores."""
    marked = [v for v in namespace.values() if callable(v) and getattr(v, "__veri_reward__", 0)]
    return marked or ([namespace["reward"]] if callable(namespace.get("reward")) else [])


@functools.lru_cache(maxsize=8)
def _rewards_of(source: str) -> list:
    namespace = {"__name__": "veri_reward"}
    exec(compile(source, "reward.py", "exec"), namespace)  # customer code: a grader child only
    functions = reward_functions(namespace)
    if not functions:
        raise ValueError("reward_source defines no `reward` function")
    return functions


def reward_grade(source: str, sample: dict, item: dict) -> float:
    """One sample's reward as a GRPO job's reward functions give it: called as TRL calls them,
    with one prompt (the item's `prompt`, else its `messages`), one completion (the assistant's
    message for a chat prompt, else the text) and the item's other fields as one-value columns;
    the functions' scores added."""
    prompt = item.get("prompt", item.get("messages"))
    text = sample["output_text"]
    completion = [{"role": "assistant", "content": text}] if isinstance(prompt, list) else text
    columns = {key: [value] for key, value in item.items() if key != "prompt"}
    total = 0.0
    for function in _rewards_of(source):
        name = getattr(function, "__name__", "reward")
        values = function(prompts=[prompt], completions=[completion], **columns)
        if not isinstance(values, list | tuple) or len(values) != 1:
            returned = (
                f"{len(values)} values for 1 completion"
                if isinstance(values, list | tuple)
                else type(values).__name__
            )
            raise TypeError(
                f"the reward function {name} must return a list of numbers, one per "
                f"completion; it returned {returned}"
            )
        total += _number(values[0], name)
    return total


REWARD_GRADE = '''"""A reward function as a python grader: Veri wrote it from a reward_source."""

import json

from worker.graders import reward_grade

SOURCE = json.loads({source!r})


def grade(sample, item):
    return reward_grade(SOURCE, sample, item)
'''


def reward_grader(source: str) -> dict:
    """A python grader scoring each sample with the reward functions of `source` (checked by
    the caller), so that it runs where and how a python grader runs."""
    grader = {
        "type": "python",
        "name": "reward_source",
        "source": REWARD_GRADE.format(source=json.dumps(source)),
    }
    check_grader(grader)
    return grader


# --- on the control plane: a python grader in a sandboxed child


def run_isolated(grader: dict, *, sample: dict, item: dict, timeout: float = 10.0) -> dict:
    """`score` in a child process (`python -m worker.grader_run`), sandboxed as the training
    process is when this process is root; whatever the grader does (raises, hangs, prints,
    exits, returns garbage), the answer is `score`'s dict with its error flags set, never an
    exception. GraderError only for an invalid grader, before anything runs."""
    from worker import grader_run  # imported here: it imports this module

    check_grader(grader)
    return grader_run.run(grader, sample=sample, item=item, timeout=timeout)
