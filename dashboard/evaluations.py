"""Dashboard pages of evaluations (compare on a file): the list, and one evaluation's summary
with its per-sample table, both models' outputs side by side."""

import json

from django import forms
from django.core.paginator import Paginator
from django.shortcuts import redirect, render

from dashboard.workspaces import or_404, workspace_view
from serving import selectors
from serving.services import evaluations as services
from training import selectors as training_selectors
from training.models import Dataset
from veri.errors import VeriError

PAGE = 25
SAMPLES = 50  # rows of the per-sample table on a page


class NewEvaluationForm(forms.Form):
    """An evaluation's fields; what they may be is the service's to say (its errors are shown
    next to the field they name)."""

    model = forms.CharField(
        max_length=500,
        help_text="an ft: model, an adapter or a base a deployment serves",
        widget=forms.TextInput(attrs={"list": "served-models"}),
    )
    baseline = forms.CharField(
        max_length=500,
        help_text="the model to compare with (its base, say)",
        widget=forms.TextInput(attrs={"list": "served-models"}),
    )
    file = forms.ChoiceField(help_text="a held-out JSONL uploaded to this workspace")
    grader = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 6}),
        help_text='an OpenAI-style grader object: {"type": "string_check", ...}',
    )
    reward_source = forms.CharField(
        required=False,
        strip=False,
        widget=forms.Textarea(attrs={"rows": 6}),
        help_text="or GRPO reward functions: def reward(prompts, completions, **kwargs)",
    )
    max_tokens = forms.IntegerField(min_value=1, max_value=4096, initial=256)

    def __init__(self, *args, workspace, **kwargs):
        super().__init__(*args, **kwargs)
        datasets = training_selectors.list_datasets(workspace=workspace).filter(
            source=Dataset.Source.UPLOAD
        )
        self.fields["file"].choices = [
            (d.public_id, f"{d.name or d.public_id} ({d.public_id})")
            for d in datasets.order_by("-pk")
        ]

    def clean_grader(self) -> dict | None:
        text = self.cleaned_data["grader"].strip()
        if not text:
            return None
        try:
            return json.loads(text)
        except ValueError as exc:
            raise forms.ValidationError(f"The grader is not JSON: {exc}.") from None

    def clean_reward_source(self) -> str | None:
        return (
            self.cleaned_data["reward_source"]
            if self.cleaned_data["reward_source"].strip()
            else None
        )


def served_models(workspace) -> list[str]:
    """Every name a deployment of the workspace serves: the form's suggestions."""
    names = set()
    for deployment in selectors.list_deployments(workspace=workspace):
        names |= deployment.served_names()
    return sorted(names)


@workspace_view
def evaluation_list(request):
    """The evaluations, and a form starting one (answered with its page)."""
    form = NewEvaluationForm(request.POST or None, workspace=request.workspace)
    if request.method == "POST" and form.is_valid():
        try:
            evaluation = services.create_evaluation(
                workspace=request.workspace, **form.cleaned_data
            )
        except VeriError as exc:
            field = (exc.field or "").split(".")[0]
            form.add_error(field if field in form.fields else None, exc.message)
        else:
            return redirect("dashboard:evaluation", evaluation.public_id)
    evaluations = selectors.list_evaluations(workspace=request.workspace)
    page = Paginator(evaluations, PAGE).get_page(request.GET.get("page"))
    return render(
        request,
        "dashboard/evaluations.html",
        {"page": page, "form": form, "served": served_models(request.workspace)},
    )


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
            "page": page,
            "rows": rows,
        },
    )
