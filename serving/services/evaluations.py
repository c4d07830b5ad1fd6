"""Compare on a file: two deployed models answer every row of a held-out dataset, one grader
scores each answer, and the summary says which is better and how sure that is.

- Rows: a chat row `{"messages": [...]}` ending with an assistant message is asked its
  messages before that one, and that message's text is the row's `reference` (unless the row
  has its own); a chat row ending otherwise is asked all its messages; a `{"prompt": ...}` row
  (text, or messages) is asked its prompt, a text one through `/v1/completions`. The grader's
  `item` is the row, its `messages` being those asked.
- Answers go through the inference router (`inference.route` wakes a cold deployment, as a
  client's request does), greedy by default.
- Graders: an OpenAI-style grader object, or a reward source (GRPO reward functions, scored
  through a python grader that calls them as TRL does).
- Scores: the grader runs in `worker.graders.run_isolated`'s sandboxed child, never in this
  process. A score the grader could not give (its code raised, a template named a field the row
  lacks) is saved as 0 with the grader's message, as OpenAI's graders do, but is not counted:
  the means leave it out, the win rate leaves its sample out, and the summary says how many
  answers could not be scored and the first error. When no sample has both answers scored the
  evaluation fails (`grader_failed`).
- Summary: each model's mean with a 95% confidence interval by the normal approximation
  (mean ± 1.96 · s/√n, s the sample standard deviation) clamped to the scores there can be (the
  grader's `range`, else the lowest and highest score given), and the model's win rate over the
  baseline, a tie counting half.
"""

import json
import math
import time
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from serving import selectors
from serving.models import Evaluation, EvaluationSample, EvaluationStatus
from serving.services import inference
from training import specs
from training.models import Dataset
from veri.errors import VeriError
from veri.models import Workspace
from veri.queue import enqueue_on_commit
from volumes.stores import keys, store_for
from worker import formats, grader_run, graders

S = EvaluationStatus
MAX_ROWS = 1000
MAX_FILE_BYTES = 20 * 1024**2
Z_95 = 1.959963984540054  # the standard normal's 97.5th percentile
# A task works this long, then queues its continuation, well within the cluster's task timeout
# (and what was answered stays answered when a task is cut short anyway).
TASK_BUDGET_SECONDS = 240.0
# How long a sample waits for its model's deployment to wake before the evaluation fails.
WAKE_SECONDS = 900.0
# Longer than waiting for a cold model, then a task's budget and an answer at the serving read
# timeout: quiet for this long, an unfinished evaluation has lost its task.
STALLED_SECONDS = 1800
SERVER_ERRORS = 3  # server errors of one request before the evaluation fails

# The evaluation error catalog: every code a failed evaluation ends with, and what to do.
ERRORS = {
    "model_unavailable": "Deploy the model again (veri deploy MODEL), then rerun the evaluation.",
    "model_start_timeout": "The deployment did not become ready in time; retry later.",
    "inference_error": "The model refused a row (the message says why): fix the row or "
    "lower max_tokens, then rerun the evaluation.",
    "grader_failed": "Fix the grader (the message gives its first error; every sample's is in "
    "GET /v1/evaluations/ID), then rerun the evaluation.",
}


class EvaluationFailed(Exception):
    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code, self.message = code, message


# --- the file's rows


def sample_of(row) -> tuple[list | str, dict] | None:
    """(what the models are asked, the grader's item) for one row; None for a row that asks
    nothing."""
    if not isinstance(row, dict):
        return None
    messages = row.get("messages")
    if isinstance(messages, list) and messages and all(isinstance(m, dict) for m in messages):
        if messages[-1].get("role") == "assistant":
            asked = messages[:-1]
            try:
                reference = formats.text_of(messages[-1].get("content"))
            except (KeyError, TypeError):  # content that is not text parts: not a chat row
                return None
            item = {"reference": reference, **row, "messages": asked}
        else:
            asked, item = messages, row
        return (asked, item) if asked else None
    prompt = row.get("prompt")
    if (isinstance(prompt, str) and prompt) or (
        isinstance(prompt, list) and prompt and all(isinstance(m, dict) for m in prompt)
    ):
        return prompt, row
    return None


def _rows(dataset: Dataset) -> list[tuple[list | str, dict]]:
    if dataset.source != Dataset.Source.UPLOAD or not dataset.object_key:
        raise VeriError(
            f"Dataset {dataset.public_id} is not an uploaded file; evaluations read uploaded "
            "JSONL files (veri datasets upload FILE).",
            field="file",
        )
    if dataset.size_bytes > MAX_FILE_BYTES:
        raise VeriError(
            f"An evaluation file is at most {MAX_FILE_BYTES} bytes; this one is "
            f"{dataset.size_bytes}.",
            field="file",
        )
    content = store_for(keys.workspace_prefix(dataset.workspace.public_id)).get_bytes(
        dataset.object_key
    )
    found = []
    for number, line in enumerate(content.decode("utf-8", "replace").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            asked = sample_of(json.loads(line))
        except (ValueError, RecursionError):
            asked = None
        if asked is None:
            raise VeriError(
                f"Line {number} of the file asks the models nothing: each row needs `messages` "
                "(OpenAI chat) or `prompt` (Veri).",
                field="file",
            )
        found.append(asked)
        if len(found) > MAX_ROWS:
            raise VeriError(f"An evaluation file has at most {MAX_ROWS} rows.", field="file")
    if not found:
        raise VeriError("The file has no rows.", field="file")
    return found


# --- creating one


def _grader(grader, reward_source: str | None) -> dict:
    """The checked grader: the one given, or one scoring with the reward functions of
    `reward_source` (exactly one of them)."""
    if grader is None and reward_source is None:
        raise VeriError(
            "Give a grader (an OpenAI-style grader object) or a reward_source (one of them).",
            field="grader",
        )
    if grader is not None and reward_source is not None:
        raise VeriError(
            "Give a grader (an OpenAI-style grader object) or a reward_source, not both.",
            field="grader",
        )
    if reward_source is not None:
        specs.check_reward_source(reward_source)
        grader = graders.reward_grader(reward_source)
    _check_grader(grader)
    return grader


def _check_grader(grader) -> None:
    try:
        graders.check_grader(grader)
    except graders.GraderError as exc:
        raise VeriError(exc.message, field=exc.param, code="invalid_grader") from None
    if problem := grader_run.unavailable(grader):  # else every score would be that error's 0
        raise VeriError(
            f"This grader's code cannot run here: {problem}.",
            field="grader",
            code="grader_unavailable",
        )


def _check_served(*, workspace: Workspace, model: str, field: str) -> None:
    if selectors.serving(workspace=workspace, model=model) is None:
        raise VeriError(
            f"The model {model[:200]!r} is not deployed in this workspace "
            "(veri deploy MODEL starts serving it).",
            field=field,
            code="model_not_found",
        )


def create_evaluation(
    *,
    workspace: Workspace,
    model: str,
    baseline: str,
    file: str,
    max_tokens: int,
    grader: dict | None = None,
    reward_source: str | None = None,
    temperature: float = 0.0,
) -> Evaluation:
    """Check everything a user could have got wrong (naming the field), write the evaluation and
    one sample per row, and queue its run once committed."""
    _check_served(workspace=workspace, model=model, field="model")
    _check_served(workspace=workspace, model=baseline, field="baseline")
    grader = _grader(grader, reward_source)
    dataset = selectors.evaluation_dataset(workspace=workspace, file=file)
    rows = _rows(dataset)
    with transaction.atomic():
        evaluation = Evaluation.objects.create(
            workspace=workspace,
            model=model,
            baseline=baseline,
            file=file,
            dataset=dataset,
            grader=grader,
            reward_source=reward_source or "",
            max_tokens=max_tokens,
            temperature=temperature,
        )
        EvaluationSample.objects.bulk_create(
            EvaluationSample(evaluation=evaluation, index=index, prompt=prompt, item=item)
            for index, (prompt, item) in enumerate(rows)
        )
        enqueue_on_commit("serving.tasks.run_evaluation", evaluation_id=evaluation.pk)
    return evaluation


# --- running one


def _claim(evaluation_id: int) -> Evaluation | None:
    """The evaluation, now running; None once it has finished (a rerun does nothing)."""
    with transaction.atomic():
        evaluation = Evaluation.objects.select_for_update().get(pk=evaluation_id)
        if evaluation.status in (S.SUCCEEDED, S.FAILED):
            return None
        if evaluation.status == S.QUEUED:
            evaluation.status, evaluation.started_at = S.RUNNING, timezone.now()
            evaluation.save(update_fields=["status", "started_at"])
        return evaluation


def _finish(evaluation: Evaluation, *, error: EvaluationFailed | None = None) -> None:
    with transaction.atomic():
        locked = Evaluation.objects.select_for_update().get(pk=evaluation.pk)
        if locked.status != S.RUNNING:
            return  # a twin task finished it
        if error is None:
            try:
                locked.status, locked.summary = S.SUCCEEDED, summarize(locked)
            except EvaluationFailed as exc:  # nothing could be scored
                error = exc
        if error is not None:
            locked.status = S.FAILED
            locked.error_code, locked.error_message = error.code, error.message
        locked.finished_at = timezone.now()
        locked.save()


def _request(evaluation: Evaluation, prompt: list | str, model: str) -> tuple[str, bytes]:
    body = {
        "model": model,
        "max_tokens": evaluation.max_tokens,
        "temperature": evaluation.temperature,
    }
    if isinstance(prompt, str):
        return "/v1/completions", json.dumps(body | {"prompt": prompt}).encode()
    return "/v1/chat/completions", json.dumps(body | {"messages": prompt}).encode()


def _text_of(answered) -> str | None:
    """The first choice's text of a completion or chat completion; None for anything else."""
    try:
        choice = answered["choices"][0]
        text = choice["message"]["content"] if "message" in choice else choice["text"]
    except (KeyError, IndexError, TypeError):
        return None
    if text is None:
        return ""  # no content (only tool calls, say): an empty answer
    return text if isinstance(text, str) else None


def answer(evaluation: Evaluation, prompt: list | str, model: str) -> str:
    """`model`'s answer to `prompt`, through the router: a cold deployment is woken and waited
    for (up to WAKE_SECONDS), a replica lost mid-answer retried on the next."""
    path, body = _request(evaluation, prompt, model)
    deadline, failures = time.monotonic() + WAKE_SECONDS, 0
    while True:
        try:
            held = inference.route(workspace=evaluation.workspace, model=model)
            response = inference.forward(held=held, path=path, body=body)
        except inference.ModelStarting:
            if time.monotonic() >= deadline:
                raise EvaluationFailed(
                    "model_start_timeout",
                    f"{model} did not become ready within {WAKE_SECONDS:g} s.",
                ) from None
            time.sleep(inference.POLL_SECONDS * 4)
            continue
        except VeriError as exc:  # not deployed any more, or its deployment failed
            raise EvaluationFailed("model_unavailable", exc.message) from None
        content = b"".join(response.streaming_content)
        try:
            answered = json.loads(content)
        except ValueError:
            answered = None
        if response.status_code == 200 and (text := _text_of(answered)) is not None:
            return text
        if response.status_code >= 500 and (failures := failures + 1) < SERVER_ERRORS:
            time.sleep(failures)
            continue  # the replica failed mid-answer: the router starts another
        error = (answered or {}).get("error") if isinstance(answered, dict) else None
        message = (
            error.get("message")
            if isinstance(error, dict)
            else content[:300].decode("utf-8", "replace")
        )
        raise EvaluationFailed(
            "inference_error", f"{model} answered {response.status_code}: {message}"
        )


def score(grader: dict, *, output: str, item: dict) -> tuple[float, str]:
    """The grader's reward for `output` on `item`, scored in the sandboxed child; and its
    message when it could not score (the reward is then 0)."""
    result = graders.run_isolated(
        grader,
        sample=graders.sample_for(output),
        item=item,
        timeout=settings.VERI_GRADER_TIMEOUT_SECONDS,
    )
    return result["reward"], result["error"] or ""


def _complete(evaluation: Evaluation, sample: EvaluationSample) -> None:
    """Answer and score what the sample still lacks; each part is saved as soon as it is
    known, only where nothing was saved before (a twin task's work is kept, not redone)."""
    this = EvaluationSample.objects.filter(pk=sample.pk)
    alive = Evaluation.objects.filter(pk=evaluation.pk)
    for side, model in (("model", evaluation.model), ("baseline", evaluation.baseline)):
        if getattr(sample, f"{side}_output") is None:
            output = answer(evaluation, sample.prompt, model)
            this.filter(**{f"{side}_output__isnull": True}).update(**{f"{side}_output": output})
            alive.update(progress_at=timezone.now())
            sample.refresh_from_db()
        if getattr(sample, f"{side}_score") is None:
            output = getattr(sample, f"{side}_output")
            reward, error = score(evaluation.grader, output=output, item=sample.item)
            this.filter(**{f"{side}_score__isnull": True}).update(
                **{f"{side}_score": reward, f"{side}_grader_error": error}
            )
            alive.update(progress_at=timezone.now())


def run_evaluation(*, evaluation_id: int) -> str:
    """Answer and score every sample still open, then summarize. Safe to run again or twice at
    once: a finished evaluation is left alone, a sample answered is never answered again, and
    after TASK_BUDGET_SECONDS the task queues its own continuation."""
    evaluation = _claim(evaluation_id)
    if evaluation is None:
        return "finished already"
    started = time.monotonic()
    pending = evaluation.samples.filter(model_score__isnull=True) | evaluation.samples.filter(
        baseline_score__isnull=True
    )
    try:
        for sample in pending.order_by("index"):
            if time.monotonic() - started > TASK_BUDGET_SECONDS:
                enqueue_on_commit("serving.tasks.run_evaluation", evaluation_id=evaluation.pk)
                return "continued"
            _complete(evaluation, sample)
    except EvaluationFailed as exc:
        _finish(evaluation, error=exc)
        return exc.code
    _finish(evaluation)
    return "succeeded"


def resume_stalled(*, now: datetime) -> int:
    """Queue again the unfinished evaluations quiet for STALLED_SECONDS (their task lost with a
    killed task worker, or never queued): each is claimed by a conditional UPDATE, so two sweeps
    queue it once; a twin of a task still running only repeats nothing (see run_evaluation)."""
    stalled = Evaluation.objects.filter(
        status__in=[S.QUEUED, S.RUNNING],
        progress_at__lt=now - timedelta(seconds=STALLED_SECONDS),
    )
    resumed = 0
    for pk in stalled.order_by("progress_at").values_list("pk", flat=True)[:100]:
        if stalled.filter(pk=pk).update(progress_at=now):
            enqueue_on_commit("serving.tasks.run_evaluation", evaluation_id=pk)
            resumed += 1
    return resumed


# --- the summary


def score_bounds(grader: dict, scores: list[float]) -> tuple[float, float]:
    """The lowest and highest score there can be: the grader's own `range` where it gives one
    (a score_model grader does), else the lowest and highest score given."""
    given = grader.get("range")
    if (
        isinstance(given, list)
        and len(given) == 2
        and all(isinstance(v, int | float) and math.isfinite(v) for v in given)
        and given[0] <= given[1]
    ):
        return float(given[0]), float(given[1])
    return min(scores), max(scores)


def mean_interval(scores: list[float], bounds: tuple[float, float] | None = None) -> dict:
    """The mean and its 95% confidence interval by the normal approximation, kept within
    `bounds` (no mean can lie outside the scores there can be); with one score, the interval
    is the mean itself."""
    n = len(scores)
    mean = math.fsum(scores) / n
    if n < 2:
        return {"mean": mean, "ci_low": mean, "ci_high": mean}
    deviation = math.sqrt(math.fsum((s - mean) ** 2 for s in scores) / (n - 1))
    half = Z_95 * deviation / math.sqrt(n)
    low, high = bounds or (-math.inf, math.inf)
    return {"mean": mean, "ci_low": max(mean - half, low), "ci_high": min(mean + half, high)}


def _mean_of(evaluation: Evaluation, scores: list[float]) -> dict:
    return mean_interval(scores, score_bounds(evaluation.grader, scores))


def summarize(evaluation: Evaluation) -> dict:
    """The means over the answers the grader scored, the win rate over the samples with both
    answers scored; EvaluationFailed (`grader_failed`) when there is no such sample."""
    rows = evaluation.samples.order_by("index").values_list(
        "model_score", "baseline_score", "model_grader_error", "baseline_grader_error"
    )
    rows = list(rows)
    errors = [
        error
        for *_, model_error, baseline_error in rows
        for error in (model_error, baseline_error)
        if error
    ]
    pairs = [
        (m, b)
        for m, b, model_error, baseline_error in rows
        if not model_error and not baseline_error
    ]
    if not pairs:
        raise EvaluationFailed(
            "grader_failed",
            f"The grader could not score {len(errors)} of {2 * len(rows)} answers, so no sample "
            f"compares the models; its first error: {errors[0][:500] if errors else 'none'}",
        )
    wins = sum(m > b for m, b in pairs)
    ties = sum(m == b for m, b in pairs)
    return {
        "samples": len(pairs),
        "unscored_answers": len(errors),
        "first_grader_error": errors[0][:500] if errors else "",
        "model": _mean_of(evaluation, [m for m, _, error, _ in rows if not error]),
        "baseline": _mean_of(evaluation, [b for _, b, _, error in rows if not error]),
        "wins": wins,
        "ties": ties,
        "losses": len(pairs) - wins - ties,
        "win_rate": (wins + ties / 2) / len(pairs),
    }
