"""What the metrics view says about runs, and the compare page: the metrics a run does not report
because of its configuration (and why), and several runs' configurations side by side."""

import json

from django.shortcuts import render
from django.urls import reverse

from dashboard.workspaces import or_404, workspace_view
from training import selectors
from training.models import TrainingJob

MAX_RUNS = 8  # runs on one compare page: more series than that is no longer readable


def metric_notes(job: TrainingJob) -> dict[str, str]:
    """Metrics the run leaves out by configuration, each with the reason: the metrics view shows
    the reason where the chart would be instead of leaving the reader to wonder."""
    hp = job.hyperparameters or {}
    notes = {}
    if job.method == "grpo" and not hp.get("kl_coef"):
        notes["kl"] = (
            "Not reported: kl_coef is 0, so GRPO trains without a KL penalty and never computes "
            "the KL to the base model. Set kl_coef above 0 to see it."
        )
    if job.validation_dataset_id is None:
        notes["eval_loss"] = (
            "Not reported: the job has no validation dataset. Give one "
            "(validation_dataset_id) to see the validation loss."
        )
    return notes


def _text(value) -> str:
    if value is None or value == "":
        return "—"
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True)


def config_rows(jobs: list[TrainingJob]) -> list[dict]:
    """One row per setting of any of `jobs` (hyperparameters and LoRA options flattened, a
    setting a job lacks shown as `—`), each with its (job id, value) cells in the jobs' order
    and whether the values differ."""
    fixed = [
        ("output name", lambda j: j.output_name),
        ("method", lambda j: j.method),
        ("base model", lambda j: j.base_model),
        ("dataset", lambda j: j.dataset.public_id),
        ("validation dataset", lambda j: j.validation_dataset and j.validation_dataset.public_id),
        ("GPU", lambda j: f"{j.gpu_count}x {j.gpu_type} on {j.provider}"),
        ("checkpoint every", lambda j: j.checkpoint_every),
        ("auto-resume", lambda j: j.auto_resume),
        ("max restarts", lambda j: j.max_restarts),
        ("resumed from", lambda j: j.resume_from_id and j.resume_from.public_id),
    ]
    rows = [(name, [_text(read(j)) for j in jobs]) for name, read in fixed]
    for group in ("hyperparameters", "lora"):
        settings = [getattr(j, group) or {} for j in jobs]
        for key in sorted({k for given in settings for k in given}):
            rows.append((f"{group}.{key}", [_text(given.get(key)) for given in settings]))
    ids = [j.public_id for j in jobs]
    return [
        {"name": name, "cells": list(zip(ids, v, strict=True)), "differs": len(set(v)) > 1}
        for name, v in rows
    ]


def _ids(request) -> list[str]:
    """`?ids=a,b` or `?ids=a&ids=b` (the jobs list's ticked boxes), in order, once each."""
    given = [i.strip() for value in request.GET.getlist("ids") for i in value.split(",")]
    return list(dict.fromkeys(i for i in given if i))


@workspace_view
def compare(request):
    """Runs side by side: their metrics overlaid (drawn by metrics.js from each job's
    metrics.json) and their configurations, differing rows marked. Another workspace's job id
    is a 404, as on its own page."""
    ids = _ids(request)[:MAX_RUNS]
    jobs = [or_404(selectors.get_job, workspace=request.workspace, job_id=i) for i in ids]
    runs = [
        {
            "id": j.public_id,
            "metrics_url": reverse("dashboard:job_metrics", args=[j.public_id]),
            "notes": metric_notes(j),
        }
        for j in jobs
    ]
    return render(
        request,
        "dashboard/compare.html",
        {"jobs": jobs, "runs": runs, "rows": config_rows(jobs), "max_runs": MAX_RUNS},
    )
