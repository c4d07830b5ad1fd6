"""`@reward_function`: marks the function in a reward source that scores GRPO completions."""

from collections.abc import Callable


def reward_function(function: Callable) -> Callable:
    """The worker calls it as `fn(prompts=..., completions=..., **dataset_columns)` and expects one
    float per completion. It runs on the worker only, never in the control plane."""
    function.__veri_reward__ = True
    return function
