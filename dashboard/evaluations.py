"""Dashboard pages of evaluations (compare on a file): the list, and one evaluation's summary
with its per-sample table, both models' outputs side by side."""

import json

from django.core.paginator import Paginator
from django.shortcuts import render

from dashboard.workspaces import or_404, workspace_view
from serving import selectors
from serving.services import evaluations as services

PAGE = 25
SAMPLES = 50  # rows of the per-sample table on a page


@workspace_view
def evaluation_list(request):
    evaluations = selectors.list_evaluations(workspace=request.workspace)
    page = Paginator(evaluations, PAGE).get_page(request.GET.get("page"))
    return render(request, "dashboard/evaluations.html", {"page": page})


def prompt_text(prompt) -> str:
    """A prompt as the table shows it: a text prompt as it is, messages one per line with their
    role."""
    if isinstance(prompt, str):
        return prompt
    lines = []
    for message in prompt:
        content = message.get("content")
        if not isinstance(content, str):
            content = json.dumps(content)
        lines.append(f"{message.get('role', '?')}: {content}")
    return "\n".join(lines)


def winner(sample) -> str:
    if sample.model_score is None or sample.baseline_score is None:
        return ""
    if sample.model_score == sample.baseline_score:
        return "tie"
    return "model" if sample.model_score > sample.baseline_score else "baseline"


@workspace_view
def evaluation_detail(request, evaluation_id: str):
    evaluation = or_404(
        selectors.get_evaluation, workspace=request.workspace, evaluation_id=evaluation_id
    )
    samples = selectors.list_evaluation_samples(evaluation=evaluation)
    scored = samples.filter(model_score__isnull=False, baseline_score__isnull=False).count()
    page = Paginator(samples, SAMPLES).get_page(request.GET.get("page"))
    rows = [{"sample": s, "prompt": prompt_text(s.prompt), "winner": winner(s)} for s in page]
    return render(
        request,
        "dashboard/evaluation.html",
        {
            "evaluation": evaluation,
            "summary": evaluation.summary or None,
            "hint": services.ERRORS.get(evaluation.error_code, ""),
            "grader": json.dumps(evaluation.grader, indent=2),
            "scored": scored,
            "total": samples.count(),
            "page": page,
            "rows": rows,
        },
    )
