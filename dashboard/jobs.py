"""Dashboard pages of training jobs: the list, a new-job form, a job's page with its tabs, and
the small JSON reads its scripts poll for live updates. Reads go through the workspace's
selectors (another workspace's job is 404); changes through the training services."""

import json
import math
from dataclasses import dataclass

from django.core.paginator import Paginator
from django.db.models import Q
from django.http import Http404, JsonResponse, StreamingHttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST

from billing import selectors as billing_selectors
from dashboard import progress, runs
from dashboard.forms import NewJobForm, form_field_for, method_defaults
from dashboard.templatetags.dashboard import dollars, money
from dashboard.workspaces import int_param, or_404, workspace_view
from training import errors, reuse, selectors, specs
from training.models import JobStatus
from training.services import datasets as dataset_services
from training.services import jobs as job_services
from training.services import logs as log_services
from training.services import quotes as quote_services
from veri.errors import VeriError

PAGE = 25
LOG_LINES = 1000
SAMPLE_GROUPS = 10  # prompts (each with its rollouts) on a page of the Samples table


def workspace_job(request, job_id: str):
    return or_404(selectors.get_job, workspace=request.workspace, job_id=job_id)


@workspace_view
def job_list(request):
    jobs = selectors.list_jobs(workspace=request.workspace).select_related("instance")
    jobs = jobs.order_by("-pk")
    status, query = request.GET.get("status", ""), request.GET.get("q", "").strip()
    if status in JobStatus.values:
        jobs = jobs.filter(status=status)
    if query:
        jobs = jobs.filter(Q(public_id__icontains=query) | Q(output_name__icontains=query))
    page = Paginator(jobs, PAGE).get_page(request.GET.get("page"))
    for job, now in zip(page, progress.jobs_progress(list(page)), strict=True):
        job.progress = now
    return render(
        request,
        "dashboard/jobs.html",
        {
            "page": page,
            "statuses": JobStatus.values,
            "status": status,
            "query": query,
            "max_compare": runs.MAX_RUNS,
        },
    )


@workspace_view
def job_new(request):
    """The new-job form; `?clone=<job id>` fills it with that job's values."""
    kept: list[str] = []  # what the form keeps of the files chosen before an error
    if request.method == "POST":
        data = request.POST.copy()
        datasets = _dataset_choices(request, data.get("dataset"))
        upload_error = _take_files(request, data, datasets, kept)
        form = NewJobForm(data, datasets=datasets)
        if form.is_valid() and not upload_error:
            try:
                job = job_services.submit_job(
                    workspace=request.workspace,
                    submission=job_services.Submission(**form.submission_fields()),
                )
                return redirect("dashboard:job", job_id=job.public_id)
            except VeriError as exc:
                form.add_error(form_field_for(exc.field), exc.message)
        if upload_error:
            form.add_error("dataset_file", upload_error)
    else:
        initial, source = {}, None
        if clone := request.GET.get("clone"):
            source = workspace_job(request, clone)
            initial = NewJobForm.initial_from(job_services.submission_of(source))
            initial["reward_name"] = (
                f"the reward of {source.public_id}" if source.reward_source else ""
            )
        form = NewJobForm(
            initial=initial, datasets=_dataset_choices(request, initial.get("dataset"))
        )
        if source:
            kept.append(f"Filled in from {source.public_id}: change what you like and submit.")
            left = [
                name
                for name, value in (
                    ("volumes", _asked_volumes(source)),
                    ("integrations", source.integrations),
                    ("validation dataset", source.validation_dataset_id),
                )
                if value
            ]
            if left:
                kept.append(f"Not on this form, so not cloned: its {', '.join(left)}.")
    if form["reward_source"].value():
        name = form["reward_name"].value() or "the reward file"
        kept.append(f"Reward: {name} is kept; choose a file only to replace it.")
    context = {"form": form, "kept": kept, "defaults": method_defaults()}
    return render(request, "dashboard/job_new.html", context)


def _dataset_choices(request, chosen: str | None) -> list:
    """The workspace's newest datasets, and the chosen one (a clone's, a posted one) if older."""
    datasets = list(selectors.list_datasets(workspace=request.workspace).order_by("-pk")[:200])
    if chosen and all(d.public_id != chosen for d in datasets):
        datasets += selectors.list_datasets(workspace=request.workspace).filter(public_id=chosen)
    return datasets


def _asked_volumes(job) -> list[str]:
    """The volumes a job was given by name, beyond those its base model and dataset imply."""
    implied = {job.base_model.removeprefix("volume://").split("/", 1)[0]}
    if job.dataset.volume_id:
        implied.add(job.dataset.volume.public_id)
    return [v["name"] for v in job.volumes if not implied & {v["name"], v["id"]}]


def _take_files(request, data, datasets: list, kept: list[str]) -> str | None:
    """Files a browser cannot give back after an error, kept as values the form can: an upload
    becomes a dataset (the same bytes again are the same dataset) and is selected, a reward
    file's text rides in `reward_source`. Returns the upload's error, if any."""
    if reward := request.FILES.get("reward_file"):
        data["reward_source"] = reward.read().decode("utf-8", "replace")
        data["reward_name"] = reward.name
    upload = request.FILES.get("dataset_file")
    if not upload:
        return None
    try:
        dataset, _ = dataset_services.create_uploaded_dataset(
            workspace=request.workspace, file=upload
        )
    except VeriError as exc:
        return f"{exc.message} Choose the file again once fixed."
    data["dataset"] = dataset.public_id
    if dataset not in datasets:
        datasets.insert(0, dataset)
    kept.append(f"Dataset: {upload.name} was uploaded as {dataset.public_id}, selected below.")
    return None


# The reward does not change a quote: a form without one yet is quoted with this.
QUOTE_REWARD = "def reward(completions, **kwargs):\n    return [0.0] * len(completions)\n"


@require_POST
@workspace_view
def job_quote(request):
    """The new-job form's live quote: what its values would cost, renting and writing nothing."""
    data = request.POST.copy()
    if not data.get("reward_source"):
        data["reward_source"] = QUOTE_REWARD
    chosen = selectors.list_datasets(workspace=request.workspace).filter(
        public_id=data.get("dataset") or ""
    )
    form = NewJobForm(data, datasets=chosen)
    if not form.is_valid():
        name, errors = next(iter(form.errors.items()))
        if name == "dataset":
            message = "Pick a dataset to see a quote (a new file is quoted once submitted)."
            return JsonResponse({"error": message})
        field = form.fields.get(name)
        label = (field.label or name.replace("_", " ").capitalize()) if field else ""
        if label and errors.as_data()[0].code == "required":  # a form not filled in yet: a hint
            return JsonResponse({"error": f"Fill in {label.lower()} to see a quote."})
        return JsonResponse({"error": f"{label}: {errors[0]}" if label else errors[0]})
    try:
        quote = quote_services.quote_job(
            workspace=request.workspace,
            submission=job_services.Submission(**form.submission_fields()),
        )
    except VeriError as exc:
        return JsonResponse({"error": exc.message, "field": form_field_for(exc.field)})
    return JsonResponse({"quote": _quote_text(quote)})


def _quote_text(quote: dict) -> str:
    cost, seconds = quote["cost_micros"], quote["gpu_seconds"]
    minutes = max(1, round(seconds["expected"] / 60))
    text = (
        f"{dollars(cost['low'])} to {dollars(cost['high'])} USD, expected "
        f"{dollars(cost['expected'])} USD: "
        f"about {minutes} min on {quote['gpu_count']}x {quote['gpu_type']} "
        f"({quote['provider']}, {quote['region']}) at "
        f"{dollars(quote['price_per_hour_micros'])} USD/hour, "
        f"{quote['assumptions']['steps']} steps."
    )
    if quote["max_cost_micros"]:
        text += f" Capped at {dollars(quote['max_cost_micros'])} USD."
    return text


def _cost_usd(job) -> str | None:
    """What the job was charged, once billing attributed it (its record selected with the job)."""
    cost = billing_selectors.job_cost_micros(job=job)
    return None if cost is None else dollars(cost)


def _parameters(job) -> list[tuple[str, object, bool]]:
    """The submit parameters as (name, value, shown as code); hyperparameters and LoRA are
    `_settings`' tables."""
    rows = [
        ("provider", job.provider, False),
        ("region", job.region, False),
        ("GPU", f"{job.gpu_count}x {job.gpu_type}", False),
        ("dataset", job.dataset.public_id, True),
        ("output name", job.output_name or "—", False),
        ("checkpoint every", job.checkpoint_every or "—", False),
        ("auto-resume", _auto_resume(job), False),
        ("budget cap", money(job.max_cost_micros) if job.max_cost_micros else "—", False),
    ]
    if job.resume_from_id:
        checkpoint = job.resume_from
        rows.append(("resumed from", f"{checkpoint.public_id} (step {checkpoint.step})", True))
    return rows


def _auto_resume(job) -> str:
    return f"on, up to {job.max_restarts} restarts" if job.auto_resume else "off"


@dataclass(frozen=True)
class Setting:
    name: str
    value: str
    default: str | None  # the default's value; None when there is none for this method

    @property
    def is_default(self) -> bool:
        return self.value == self.default


def _shown(value) -> str:
    return "—" if value is None else json.dumps(value) if not isinstance(value, str) else value


def _settings(values: dict, defaults: dict) -> list[Setting]:
    """Each value the job ran with beside the default it would have had (`training.specs`, the
    one table of defaults): the defaults first, in their order, then the other names given."""
    names = list(defaults) + sorted(set(values) - set(defaults))
    return [
        Setting(name, _shown(values.get(name, defaults.get(name))), _default(defaults, name))
        for name in names
    ]


def _default(defaults: dict, name: str) -> str | None:
    return _shown(defaults[name]) if name in defaults else None


@dataclass(frozen=True)
class TimelineEntry:
    event: object
    step: int | None
    detail: str


def timeline(events) -> list[TimelineEntry]:
    """Each event with its step and what it says: its message, else its other details."""
    entries = []
    for event in events:
        detail = dict(event.detail)
        step = detail.pop("step", None)
        text = detail.pop("message", "")
        if not text:
            text = ", ".join(
                f"{key.replace('_', ' ')} {value}"
                for key, value in detail.items()
                if isinstance(value, str | int | float) and not isinstance(value, bool)
            )
            flags = [key for key, value in detail.items() if value is True]
            text = ", ".join(filter(None, [text, *flags]))
        entries.append(TimelineEntry(event, step if isinstance(step, int) else None, text))
    return entries


def _runs(job, job_money) -> list[dict]:
    """Each restarted run's compute, kept (charged) and lost (credited back), and its credit."""
    return [
        {
            "attempt": a,
            "kept_usd": dollars(a.kept_micros),
            "lost_usd": dollars(a.lost_micros),
            "credited": job_money.credit_for_attempt(a.number),
        }
        for a in job.attempts.all()
    ]


@workspace_view
def job_detail(request, job_id: str):
    job = workspace_job(request, job_id)
    checkpoints = selectors.list_checkpoints(job=job).order_by("-step", "-final")
    refund = getattr(job, "refund", None)  # select_related: None when there is none
    instance = getattr(job, "instance", None)  # cached for job_accrued_micros
    accrued, cost_usd = None, _cost_usd(job)
    if cost_usd is None and instance and instance.launched_at:
        accrued = dollars(billing_selectors.job_accrued_micros(job=job))
    job_money = billing_selectors.job_money(job=job)
    submission = job_services.submission_of(job)
    return render(
        request,
        "dashboard/job.html",
        {
            "job": job,
            "timeline": timeline(selectors.list_events(job=job).order_by("pk")),
            "checkpoints": checkpoints,
            "catalog_error": errors.CATALOG.get(job.error_code),
            "refund": refund,
            "refund_usd": dollars(refund.amount_micros) if refund else None,
            "cost_usd": cost_usd,
            "accrued_usd": accrued,
            "parameters": _parameters(job),
            "hyperparameters": _settings(job.hyperparameters, specs.DEFAULTS.get(job.method, {})),
            "lora": _settings(job.lora, specs.LORA_DEFAULTS),
            "copy_as": {
                "TOML": reuse.as_toml(submission),
                "CLI": reuse.as_cli(submission),
                "SDK": reuse.as_sdk(submission),
            },
            "money": job_money,
            "credits": [e for e in job_money.entries if e.amount_micros > 0],
            "credited_usd": (
                dollars(job_money.credited_micros) if job_money.credited_micros else None
            ),
            "net_usd": dollars(job_money.net_micros) if job_money.net_micros is not None else None,
            "runs": _runs(job, job_money),
            "progress": progress.job_progress(job),
            "metric_notes": runs.metric_notes(job),
        },
    )


@workspace_view
def job_status(request, job_id: str):
    job = workspace_job(request, job_id)
    return JsonResponse(
        {
            "progress": progress.job_progress(job).as_json(),
            "status": job.status,
            "last_step": job.last_step,
            "finished": job.is_terminal,
            "cost_usd": _cost_usd(job),
            "checkpoints": selectors.list_checkpoints(job=job).count(),
        }
    )


@workspace_view
def job_logs(request, job_id: str):
    """Lines after `?after=` (the Logs tab's live tail)."""
    job = workspace_job(request, job_id)
    after = int_param(request, "after", -1)
    lines = selectors.log_lines_after(job=job, after=after, limit=LOG_LINES)
    return JsonResponse(
        {
            "lines": [{"seq": line.seq, "text": line.text} for line in lines],
            "next_seq": lines[-1].seq if lines else after,
            "finished": job.is_terminal and len(lines) < LOG_LINES,
        }
    )


@workspace_view
def job_full_log(request, job_id: str):
    job = workspace_job(request, job_id)
    chunks = log_services.full_log(job=job) or iter(())
    response = StreamingHttpResponse(chunks, content_type="text/plain; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="{job.public_id}.log"'
    return response


@workspace_view
def job_metrics(request, job_id: str):
    """Points after `?after_step=` (the Metrics tab's live charts)."""
    job = workspace_job(request, job_id)
    after = int_param(request, "after_step", -1)
    points = selectors.list_metrics(job=job).filter(step__gt=after).order_by("step")[:5000]
    return JsonResponse(
        {
            "points": [
                {"step": p.step, "at": p.at.timestamp(), "values": p.values} for p in points
            ],
            "finished": job.is_terminal,
        }
    )


def _float_param(request, name: str) -> float | None:
    try:
        value = float(request.GET[name])
    except (KeyError, ValueError):
        return None
    return value if math.isfinite(value) else None


@workspace_view
def job_samples(request, job_id: str):
    """One page of the Samples table: rollouts grouped by step and prompt, filtered by `step`,
    `min_reward` and `max_reward`, ordered by `sort` (`-step`, `step`, `-reward`, `reward`: a
    group's mean reward); with the job's alarms."""
    job = workspace_job(request, job_id)
    step = int_param(request, "step", -1)
    found = selectors.sample_groups(
        job=job,
        step=step if step >= 0 else None,
        min_reward=_float_param(request, "min_reward"),
        max_reward=_float_param(request, "max_reward"),
        order=request.GET.get("sort", "-step"),
    )
    page = Paginator(found.groups, SAMPLE_GROUPS).get_page(request.GET.get("page"))
    groups = list(page)
    rollouts = found.rollouts_of(groups)
    alarms = selectors.list_events(job=job).filter(type__startswith="alarm_").order_by("pk")
    return JsonResponse(
        {
            "groups": [
                {
                    "step": g["step"],
                    "prompt": g["prompt"],
                    "mean_reward": g["mean_reward"],
                    "best_reward": g["best_reward"],
                    "rollouts": [
                        {
                            "index": s.index,
                            "completion": s.completion,
                            "reward": s.reward,
                            "rewards": s.rewards,
                        }
                        for s in rollouts.get((g["step"], g["prompt"]), [])
                    ],
                }
                for g in groups
            ],
            "page": page.number,
            "pages": page.paginator.num_pages,
            "total_groups": page.paginator.count,
            "total_rollouts": found.samples.count(),
            "steps": selectors.sampled_steps(job=job),
            "alarms": [
                {"type": a.type, "at": a.at.isoformat(), "message": a.detail.get("message", "")}
                for a in alarms
            ],
            "finished": job.is_terminal,
        }
    )


@workspace_view
def checkpoint_file(request, job_id: str, checkpoint_id: str, path: str):
    """A checkpoint file's download, signed at the click: links on a page left open still work."""
    job = workspace_job(request, job_id)
    checkpoint = selectors.list_checkpoints(job=job).filter(public_id=checkpoint_id).first()
    files = selectors.checkpoint_files(checkpoint=checkpoint, only=path) if checkpoint else []
    if not files:
        raise Http404
    return redirect(files[0]["url"])


@require_POST
@workspace_view
def job_cancel(request, job_id: str):
    job = workspace_job(request, job_id)
    if not job.is_terminal:
        job_services.cancel_job(job=job)
    return redirect("dashboard:job", job_id=job.public_id)


@require_POST
@workspace_view
def job_resume(request, job_id: str):
    job = workspace_job(request, job_id)
    try:
        new = job_services.resume_job(job=job, checkpoint_id=request.POST.get("checkpoint") or None)
    except VeriError as exc:
        context = {
            "title": "Not resumed",
            "message": exc.message,
            "back": reverse("dashboard:job", args=[job.public_id]) + "#checkpoints",
        }
        return render(request, "dashboard/message.html", context, status=400)
    return redirect("dashboard:job", job_id=new.public_id)
