"""Alarms on a running GRPO job, from what the worker already sends (metrics and samples), as job
events: the reward flat for a window of steps, KL past a threshold and rising, completions
collapsed to one string. Each alarm is raised once per job."""

from django.conf import settings
from django.db import IntegrityError, transaction

from training.models import JobEvent, MetricPoint, Sample, TrainingJob

REWARD_FLAT = "alarm_reward_flat"
KL_HIGH = "alarm_kl_high"
COLLAPSED = "alarm_completions_collapsed"


def _raise_once(job: TrainingJob, kind: str, detail: dict) -> bool:
    if JobEvent.objects.filter(job=job, type=kind).exists():
        return False
    try:
        with transaction.atomic():
            JobEvent.objects.create(job=job, type=kind, detail=detail)
    except IntegrityError:
        return False
    return True


def check_metrics(*, job: TrainingJob) -> list[str]:
    """After new metric points: one read of the newest window's rewards and KLs."""
    window = settings.VERI_ALARM_FLAT_STEPS
    recent = list(
        MetricPoint.objects.filter(job=job).order_by("-step").values_list("step", "values")[:window]
    )
    raised = []
    rewards = [v["reward"] for _, v in recent if isinstance(v.get("reward"), int | float)]
    if len(rewards) >= window and max(rewards) - min(rewards) <= settings.VERI_ALARM_FLAT_SPREAD:
        steps = f"{recent[-1][0]}-{recent[0][0]}"
        detail = {
            "steps": steps,
            "reward": rewards[0],
            "message": f"The reward stayed at {rewards[0]:.4g} for {window} steps.",
        }
        if _raise_once(job, REWARD_FLAT, detail):
            raised.append(REWARD_FLAT)
    kls = [v["kl"] for _, v in recent if isinstance(v.get("kl"), int | float)]
    limit = settings.VERI_ALARM_KL_MAX
    if len(kls) >= 2 and kls[0] > limit and kls[0] > kls[-1]:
        detail = {
            "step": recent[0][0],
            "kl": kls[0],
            "message": f"KL reached {kls[0]:.4g}, past {limit}, and is rising.",
        }
        if _raise_once(job, KL_HIGH, detail):
            raised.append(KL_HIGH)
    return raised


def check_samples(*, job: TrainingJob) -> list[str]:
    """After new samples: the newest sampled steps each gave one and the same completion."""
    count = settings.VERI_ALARM_COLLAPSED_STEPS
    steps = list(
        Sample.objects.filter(job=job)
        .order_by("-step")
        .values_list("step", flat=True)
        .distinct()[:count]
    )
    if len(steps) < count:
        return []
    completions = list(
        Sample.objects.filter(job=job, step__in=steps).values_list("completion", flat=True)
    )
    if len(completions) < 2 * count or len(set(completions)) != 1:
        return []
    text = next(iter(completions))
    detail = {
        "steps": steps,
        "completion": text[:200],
        "message": f"Every sampled completion of the last {count} sampled steps is the "
        "same string.",
    }
    return [COLLAPSED] if _raise_once(job, COLLAPSED, detail) else []
