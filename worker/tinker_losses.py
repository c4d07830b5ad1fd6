"""The Tinker loss functions, as the Tinker docs define them: every one is a sum over tokens
(not a mean), computed from the logprobs the model gives each target token.

- `cross_entropy`: `-(target_logprobs * weights).sum()` (weights default to 1).
- `importance_sampling`: `-(exp(target_logprobs - logprobs) * advantages).sum()`, `logprobs`
  being the sampler's.
- `ppo`: the ratio clipped to `[clip_low_threshold, clip_high_threshold]` (loss_fn_config,
  default 0.8 and 1.2), `-min(ratio * A, clipped * A).sum()`.

Each returns the loss and the per-datum outputs the client reads (`logprobs`: the target
tokens' logprobs; `elementwise_loss` for cross entropy)."""

from collections.abc import Callable

import torch

PPO_CLIP = (0.8, 1.2)


class LossInputError(ValueError):
    """The datum does not carry what the loss needs: the customer's error."""


def target_logprobs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """log p(target_i | prefix) at each position: logits (N, V), targets (N,)."""
    return torch.log_softmax(logits.float(), dim=-1).gather(-1, targets[:, None]).squeeze(-1)


def _need(inputs: dict[str, torch.Tensor], name: str, loss_fn: str, n: int) -> torch.Tensor:
    if name not in inputs:
        raise LossInputError(f"{loss_fn} needs loss_fn_inputs[{name!r}].")
    value = inputs[name].reshape(-1).float()
    if value.numel() != n:
        raise LossInputError(
            f"loss_fn_inputs[{name!r}] has {value.numel()} values for {n} target tokens."
        )
    return value


def cross_entropy(logprobs, inputs, config) -> tuple[torch.Tensor, dict]:
    n = logprobs.numel()
    weights = (
        _need(inputs, "weights", "cross_entropy", n)
        if "weights" in inputs
        else torch.ones_like(logprobs)
    )
    elementwise = -logprobs * weights
    return elementwise.sum(), {"logprobs": logprobs, "elementwise_loss": elementwise}


def importance_sampling(logprobs, inputs, config) -> tuple[torch.Tensor, dict]:
    n = logprobs.numel()
    sampled = _need(inputs, "logprobs", "importance_sampling", n)
    advantages = _need(inputs, "advantages", "importance_sampling", n)
    ratio = torch.exp(logprobs - sampled)
    return -(ratio * advantages).sum(), {"logprobs": logprobs}


def ppo(logprobs, inputs, config) -> tuple[torch.Tensor, dict]:
    n = logprobs.numel()
    sampled = _need(inputs, "logprobs", "ppo", n)
    advantages = _need(inputs, "advantages", "ppo", n)
    low = float(config.get("clip_low_threshold", PPO_CLIP[0]))
    high = float(config.get("clip_high_threshold", PPO_CLIP[1]))
    ratio = torch.exp(logprobs - sampled)
    clipped = torch.clamp(ratio, low, high)
    objective = torch.min(ratio * advantages, clipped * advantages)
    return -objective.sum(), {"logprobs": logprobs}


LOSSES: dict[str, Callable] = {
    "cross_entropy": cross_entropy,
    "importance_sampling": importance_sampling,
    "ppo": ppo,
}
