"""Marking reward functions: `@reward_function`, and `@training_job(...)`, which also carries the
job to run with it (`veri train FILE.py` finds it, checks it, submits it)."""

from collections.abc import Callable

JOB_ATTRIBUTE = "__veri_job__"


def reward_function(function: Callable) -> Callable:
    """The worker calls it as `fn(prompts=..., completions=..., **dataset_columns)` and expects one
    float per completion. It runs on the worker only, never in the control plane."""
    function.__veri_reward__ = True
    return function


def training_job(
    *,
    base_model: str,
    dataset,
    method: str = "grpo",
    gpu_type: str = "cpu",
    gpu_count: int = 1,
    region: str | None = None,
    provider: str | None = None,
    hyperparameters: dict | None = None,
    validation_dataset: str | None = None,
    **options,
) -> Callable[[Callable], Callable]:
    """A GRPO reward function and the job that trains with it:

        @training_job(base_model="volume://models/qwen", dataset="train.jsonl", gpu_type="L4-24GB")
        def reward(completions, **kwargs): ...

    `dataset` is a dataset id (`ds_…`), a local `.jsonl` (uploaded when the job is submitted),
    `volume://<volume>/<path>`, or `hf://<owner>/<name>`; so is `validation_dataset`, evaluated
    every `eval_interval` steps and never trained on. Other keyword arguments (lora,
    output_name, checkpoint_every, max_cost_usd, …) go to the submit call as they are."""

    def mark(function: Callable) -> Callable:
        reward_function(function)
        setattr(
            function,
            JOB_ATTRIBUTE,
            {
                "base_model": base_model,
                "dataset": dataset,
                "validation_dataset": validation_dataset,
                "method": method,
                "gpu_type": gpu_type,
                "gpu_count": gpu_count,
                "region": region,
                "provider": provider,
                "hyperparameters": hyperparameters or {},
                **options,
            },
        )
        return function

    return mark
