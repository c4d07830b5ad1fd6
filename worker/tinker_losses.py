"""The Tinker loss functions, as the Tinker docs define them: every one is a sum over tokens
(not a mean), computed from the logprobs the model gives each target token (`lp` below), `q`
being the sampler's logprobs the datum carries (`loss_fn_inputs["logprobs"]`), `A` its
`advantages`, `r = exp(lp - q)`.

- `cross_entropy`: `-(lp * weights).sum()` (weights default to 1).
- `importance_sampling`: `-(r * A).sum()`.
- `ppo`: `-min(r * A, clip(r, low, high) * A).sum()`.
- `cispo`: `-(sg(clip(r, low, high)) * lp * A).sum()` (sg: no gradient through it).
- `dro`: `-(lp * A - beta / 2 * (lp - q) ** 2).sum()`.
- `gspo` (GSPO-token): every token's ratio has the value of the sequence's, `s = exp(mean of
  lp - q over the positions sequence_ratio_mask marks)`, and its own token's gradient; then
  PPO's objective with that ratio.
- `stable_reinforce`: Veri's own (Tinker's formula is not published). Per sampled token, a
  REINFORCE step weighted by the truncated importance weight between this model and the sampler
  as *recorded server-side at sampling time* (`recorded`, never the client's `logprobs`):
  `-(sg(min(exp(lp - q_rec), STABLE_REINFORCE_TRUNCATION)) * A * lp).sum()`, plus
  `kl_coeff * (rho - 1 - log rho).sum()` with `rho = exp(lp - q_rec)` (an estimate of
  KL(sampler || model), 0 when `kl_coeff` is 0). Prompt positions carry no advantage.

`low`/`high` are loss_fn_config's `clip_low_threshold`/`clip_high_threshold` (0.8 and 1.2),
`beta` dro's (0.05, Tinker's own example). Each returns the loss and the per-datum outputs the
client reads (`logprobs`: the target tokens' logprobs; `elementwise_loss` for cross entropy)."""

import math
from collections.abc import Callable

import torch

CLIP = {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}
DRO = {"beta": 0.05}
STABLE_REINFORCE = {"kl_coeff": 0.0}
STABLE_REINFORCE_TRUNCATION = 2.0


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


def _config(config: dict, loss_fn: str, accepted: dict[str, float]) -> dict[str, float]:
    """The loss's settings: `accepted`'s defaults, overridden by the client's numbers; any other
    key (a typo, another loss's setting) is refused rather than silently ignored."""
    unknown = sorted(set(config) - set(accepted))
    if unknown:
        takes = ", ".join(accepted) or "none"
        raise LossInputError(
            f"{loss_fn} does not take loss_fn_config {', '.join(map(repr, unknown))} "
            f"(it takes: {takes})."
        )
    values = {}
    for name, default in accepted.items():
        value = config.get(name, default)
        number = isinstance(value, int | float) and not isinstance(value, bool)
        if not number or not math.isfinite(value):
            raise LossInputError(f"loss_fn_config[{name!r}] is a finite number, not {value!r}.")
        values[name] = float(value)
    return values


def cross_entropy(logprobs, inputs, config, recorded) -> tuple[torch.Tensor, dict]:
    _config(config, "cross_entropy", {})
    n = logprobs.numel()
    weights = (
        _need(inputs, "weights", "cross_entropy", n)
        if "weights" in inputs
        else torch.ones_like(logprobs)
    )
    elementwise = -logprobs * weights
    return elementwise.sum(), {"logprobs": logprobs, "elementwise_loss": elementwise}


def _sampled(logprobs, inputs, loss_fn) -> tuple[torch.Tensor, torch.Tensor]:
    """The sampler's logprobs and the advantages the datum carries."""
    n = logprobs.numel()
    return _need(inputs, "logprobs", loss_fn, n), _need(inputs, "advantages", loss_fn, n)


def importance_sampling(logprobs, inputs, config, recorded) -> tuple[torch.Tensor, dict]:
    _config(config, "importance_sampling", {})
    sampled, advantages = _sampled(logprobs, inputs, "importance_sampling")
    ratio = torch.exp(logprobs - sampled)
    return -(ratio * advantages).sum(), {"logprobs": logprobs}


def _clip(ratio, clip: dict[str, float]) -> torch.Tensor:
    return torch.clamp(ratio, clip["clip_low_threshold"], clip["clip_high_threshold"])


def _clipped_objective(ratio, advantages, clip: dict[str, float]) -> torch.Tensor:
    return torch.min(ratio * advantages, _clip(ratio, clip) * advantages)


def ppo(logprobs, inputs, config, recorded) -> tuple[torch.Tensor, dict]:
    clip = _config(config, "ppo", CLIP)
    sampled, advantages = _sampled(logprobs, inputs, "ppo")
    ratio = torch.exp(logprobs - sampled)
    return -_clipped_objective(ratio, advantages, clip).sum(), {"logprobs": logprobs}


def cispo(logprobs, inputs, config, recorded) -> tuple[torch.Tensor, dict]:
    clip = _config(config, "cispo", CLIP)
    sampled, advantages = _sampled(logprobs, inputs, "cispo")
    ratio = torch.exp(logprobs - sampled)
    weight = _clip(ratio, clip).detach()
    return -(weight * logprobs * advantages).sum(), {"logprobs": logprobs}


def dro(logprobs, inputs, config, recorded) -> tuple[torch.Tensor, dict]:
    beta = _config(config, "dro", DRO)["beta"]
    sampled, advantages = _sampled(logprobs, inputs, "dro")
    objective = logprobs * advantages - 0.5 * beta * (logprobs - sampled) ** 2
    return -objective.sum(), {"logprobs": logprobs}


def gspo(logprobs, inputs, config, recorded) -> tuple[torch.Tensor, dict]:
    clip = _config(config, "gspo", CLIP)
    sampled, advantages = _sampled(logprobs, inputs, "gspo")
    in_ratio = _need(inputs, "sequence_ratio_mask", "gspo", logprobs.numel()) != 0
    if not bool(in_ratio.any()):
        raise LossInputError("loss_fn_inputs['sequence_ratio_mask'] marks no token.")
    log_ratio = (logprobs.detach() - sampled)[in_ratio].mean()
    ratio = torch.exp(log_ratio + logprobs - logprobs.detach())  # s's value, lp's gradient
    return -_clipped_objective(ratio, advantages, clip).sum(), {"logprobs": logprobs}


def stable_reinforce(logprobs, inputs, config, recorded) -> tuple[torch.Tensor, dict]:
    """`recorded`: `{"logprobs", "sampled"}`, per target position the logprob the sampler gave
    that token when it drew it, and 1 where the position is a sampled token (0: a prompt's)."""
    kl_coeff = _config(config, "stable_reinforce", STABLE_REINFORCE)["kl_coeff"]
    n = logprobs.numel()
    advantages = _need(inputs, "advantages", "stable_reinforce", n)
    if recorded is None or any(t.numel() != n for t in recorded.values()):
        raise LossInputError("stable_reinforce needs each datum's provenance, one per target.")
    sampled = recorded["sampled"].reshape(-1).float()
    if bool((advantages[sampled == 0] != 0).any()):
        raise LossInputError(
            "stable_reinforce takes advantages on sampled tokens only; a prompt position has one."
        )
    log_rho = (logprobs - recorded["logprobs"].reshape(-1).float()) * sampled
    weight = torch.clamp(torch.exp(log_rho.detach()), max=STABLE_REINFORCE_TRUNCATION)
    loss = -(weight * advantages * logprobs * sampled).sum()
    if kl_coeff:  # skipped at 0: 0 * an overflowing exp would be nan
        loss = loss + kl_coeff * ((torch.exp(log_rho) - 1 - log_rho) * sampled).sum()
    return loss, {"logprobs": logprobs}


LOSSES: dict[str, Callable] = {
    "cross_entropy": cross_entropy,
    "importance_sampling": importance_sampling,
    "ppo": ppo,
    "cispo": cispo,
    "dro": dro,
    "gspo": gspo,
    "stable_reinforce": stable_reinforce,
}
