"""Each Tinker loss, run by the worker's model on the tiny model, against a plain-PyTorch
reference written from Tinker's definitions: the loss, the logprobs it reports and every LoRA
gradient agree to float tolerance."""

import re

import pytest
import torch
import torch.nn.functional as F

from worker.tinker_losses import LossInputError
from worker.tinker_model import TinkerModel

LORA = {"rank": 4, "seed": 7}
TOKENS = [[5, 17, 42, 9, 300, 11], [3, 250, 7]]


def tensor(values, dtype="float32") -> dict:
    return {"dtype": dtype, "shape": [len(values)], "data": list(values)}


def data(extra) -> list[dict]:
    """Each datum predicts its tokens shifted by one, with the loss's own inputs."""
    return [
        {
            "tokens": tokens,
            "inputs": {"target_tokens": tensor(tokens[1:] + [1], "int64")} | extra(len(tokens), i),
        }
        for i, tokens in enumerate(TOKENS)
    ]


def fresh(tiny_model) -> TinkerModel:
    torch.manual_seed(0)
    model = TinkerModel(tiny_model, LORA)
    with torch.no_grad():  # B starts at 0 (a LoRA's output is 0): make the adapter matter
        for name, p in model.model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05)
    return model


def reference(tiny_model, batch, per_token) -> tuple[float, list[list[float]], dict]:
    """The loss as plain PyTorch computes it: logprobs by F.cross_entropy, `per_token(logprobs,
    inputs)` giving each token's loss, summed; and the gradients it leaves."""
    model = fresh(tiny_model)
    total, logprobs_out = 0.0, []
    for datum in batch:
        ids = torch.tensor([datum["tokens"]])
        logits = model.model(input_ids=ids).logits[0]
        targets = torch.tensor(datum["inputs"]["target_tokens"]["data"])
        logprobs = -F.cross_entropy(logits, targets, reduction="none")
        inputs = {k: torch.tensor(v["data"]) for k, v in datum["inputs"].items()}
        loss = per_token(logprobs, inputs).sum()
        loss.backward()
        total += float(loss.detach())
        logprobs_out.append(logprobs.tolist())
    grads = {n: p.grad.clone() for n, p in model.model.named_parameters() if p.requires_grad}
    return total, logprobs_out, grads


def run(tiny_model, batch, loss_fn, config=None):
    model = fresh(tiny_model)
    result = model.forward_backward(batch, loss_fn, config or {})
    grads = {n: p.grad.clone() for n, p in model.model.named_parameters() if p.requires_grad}
    return result, grads


def assert_matches(result, grads, expected):
    loss, logprobs, ref_grads = expected
    assert result["metrics"]["loss:sum"] == pytest.approx(loss, rel=1e-5, abs=1e-6)
    for out, ref in zip(result["loss_fn_outputs"], logprobs, strict=True):
        assert out["logprobs"]["data"] == pytest.approx(ref, rel=1e-5, abs=1e-6)
    assert grads.keys() == ref_grads.keys()
    for name, grad in grads.items():
        torch.testing.assert_close(grad, ref_grads[name], rtol=1e-4, atol=1e-6, msg=name)
    assert any(float(g.abs().sum()) > 0 for g in grads.values())


def test_cross_entropy_with_weights(tiny_model):
    weights = [[0, 0, 1, 1, 0.5, 2], [1, 0, 3]]
    batch = data(lambda n, i: {"weights": tensor(weights[i])})
    result, grads = run(tiny_model, batch, "cross_entropy")
    expected = reference(tiny_model, batch, lambda lp, x: -lp * x["weights"])
    assert_matches(result, grads, expected)
    elementwise = result["loss_fn_outputs"][1]["elementwise_loss"]["data"]
    assert elementwise[1] == 0.0  # a zero weight contributes nothing


def rl_inputs(n, i):
    generator = torch.Generator().manual_seed(i)
    sampled = (-torch.rand(n, generator=generator) * 6).tolist()  # the sampler's logprobs
    advantages = (torch.randn(n, generator=generator) * 2).tolist()
    return {"logprobs": tensor(sampled), "advantages": tensor(advantages)}


def test_importance_sampling(tiny_model):
    batch = data(rl_inputs)
    result, grads = run(tiny_model, batch, "importance_sampling")

    def per_token(lp, x):
        return -(lp - x["logprobs"]).exp() * x["advantages"]

    assert_matches(result, grads, reference(tiny_model, batch, per_token))


@pytest.mark.parametrize("config", [{}, {"clip_low_threshold": 0.5, "clip_high_threshold": 3.0}])
def test_ppo_clips_the_ratio(tiny_model, config):
    batch = data(rl_inputs)
    result, grads = run(tiny_model, batch, "ppo", config)
    low, high = config.get("clip_low_threshold", 0.8), config.get("clip_high_threshold", 1.2)

    def per_token(lp, x):
        # PPO's pessimism stated the other way round: a positive advantage's gain is capped
        # at `high`, a negative one's at `low`.
        ratio, a = (lp - x["logprobs"]).exp(), x["advantages"]
        return -torch.where(
            a >= 0,
            torch.minimum(ratio, torch.tensor(high)) * a,
            torch.maximum(ratio, torch.tensor(low)) * a,
        )

    assert_matches(result, grads, reference(tiny_model, batch, per_token))


@pytest.mark.parametrize("config", [{}, {"clip_low_threshold": 0.5, "clip_high_threshold": 3.0}])
def test_cispo_weights_logprobs_by_the_clipped_ratio(tiny_model, config):
    batch = data(rl_inputs)
    result, grads = run(tiny_model, batch, "cispo", config)
    low, high = config.get("clip_low_threshold", 0.8), config.get("clip_high_threshold", 1.2)

    def per_token(lp, x):
        weight = (lp.detach() - x["logprobs"]).exp().clamp(low, high)
        return -weight * lp * x["advantages"]

    assert_matches(result, grads, reference(tiny_model, batch, per_token))


@pytest.mark.parametrize("config", [{}, {"beta": 0.5}])
def test_dro_penalises_the_squared_log_ratio(tiny_model, config):
    batch = data(rl_inputs)
    result, grads = run(tiny_model, batch, "dro", config)
    beta = config.get("beta", 0.05)

    def per_token(lp, x):
        return -(lp * x["advantages"] - beta / 2 * (lp - x["logprobs"]) ** 2)

    assert_matches(result, grads, reference(tiny_model, batch, per_token))


def gspo_inputs(n, i):
    """A prompt of 2 positions, then sampled ones: only those count in the sequence's ratio."""
    mask = [0.0, 0.0] + [1.0] * (n - 2)
    return rl_inputs(n, i) | {"sequence_ratio_mask": tensor(mask)}


@pytest.mark.parametrize("config", [{}, {"clip_low_threshold": 0.99, "clip_high_threshold": 1.01}])
def test_gspo_gives_every_token_the_sequences_ratio(tiny_model, config):
    batch = data(gspo_inputs)
    result, grads = run(tiny_model, batch, "gspo", config)
    low, high = config.get("clip_low_threshold", 0.8), config.get("clip_high_threshold", 1.2)

    def per_token(lp, x):
        # The sequence ratio (a geometric mean over the masked tokens) as a value: the product
        # of each masked token's ratio, to the power 1/|M|; the gradient is each token's own
        # ratio's, scaled by that value.
        masked = x["sequence_ratio_mask"] != 0
        ratios = (lp.detach() - x["logprobs"]).exp()[masked]
        value = ratios.prod() ** (1 / len(ratios))
        ratio = value * (lp - lp.detach()).exp()
        a = x["advantages"]
        return -torch.where(
            a >= 0,
            torch.minimum(ratio, torch.tensor(high)) * a,
            torch.maximum(ratio, torch.tensor(low)) * a,
        )

    assert_matches(result, grads, reference(tiny_model, batch, per_token))


def stable_batch(kl_coeff=0.0):
    """Prompt positions (the first 2: no advantage), then sampled ones with the logprobs the
    sampler recorded, some far below the model's (a truncated weight) and some above; the
    client's own `logprobs`, which stable_reinforce must ignore, are nonsense."""
    batch = []
    for i, datum in enumerate(data(rl_inputs)):
        n = len(datum["tokens"])
        recorded = [0.0, 0.0] + [[-40.0, -0.01, -3.0, -1.0][k % 4] for k in range(n - 2)]
        advantages = [0.0, 0.0] + [1.5 - i * 3, -0.5, 2.0, -1.0][: n - 2] + [0.7] * (n - 6)
        datum["inputs"]["advantages"] = tensor(advantages)
        datum["inputs"]["logprobs"] = tensor([100.0] * n)
        datum["recorded"] = {"logprobs": recorded, "sampled": [0, 0] + [1] * (n - 2)}
        batch.append(datum)
    return batch


@pytest.mark.parametrize("kl_coeff", [0.0, 0.3])
def test_stable_reinforce_truncates_the_weight_from_the_recorded_sampler(tiny_model, kl_coeff):
    batch = stable_batch()
    config = {"kl_coeff": kl_coeff} if kl_coeff else {}
    result, grads = run(tiny_model, batch, "stable_reinforce", config)
    recorded = iter(datum["recorded"] for datum in batch)

    def per_token(lp, x):
        rec = next(recorded)
        q, sampled = torch.tensor(rec["logprobs"]), torch.tensor(rec["sampled"]) == 1
        weight = torch.minimum((lp.detach() - q).exp(), torch.tensor(2.0))
        rho = (lp - q).exp()
        kl = rho - 1 - (lp - q)
        return torch.where(sampled, -weight * x["advantages"] * lp + kl_coeff * kl, 0.0)

    expected = reference(tiny_model, batch, per_token)
    assert_matches(result, grads, expected)
    # The weight is the recorded sampler's, not the client's `logprobs` (which would make it 0).
    assert result["metrics"]["loss:sum"] != pytest.approx(0.0)


def test_forward_only_leaves_no_gradient(tiny_model):
    model = fresh(tiny_model)
    batch = data(lambda n, i: {})
    result = model.forward_backward(batch, "cross_entropy", {}, backward=False)
    assert result["metrics"]["loss:sum"] > 0
    assert all(p.grad is None for p in model.params)


def test_an_optim_step_with_adam_lowers_the_loss_and_clears_gradients(tiny_model):
    model = fresh(tiny_model)
    batch = data(lambda n, i: {})
    first = model.forward_backward(batch, "cross_entropy", {})["metrics"]["loss:sum"]
    step = model.optim_step({"learning_rate": 1e-2, "grad_clip_norm": 1.0})
    assert step["metrics"]["grad_norm:mean"] > 0
    assert all(p.grad is None for p in model.params)
    second = model.forward_backward(batch, "cross_entropy", {}, backward=False)
    assert second["metrics"]["loss:sum"] < first


@pytest.mark.parametrize(
    ("loss_fn", "inputs", "config", "message"),
    [
        ("custom", {}, {}, "not supported"),  # an uploaded loss: Veri has none
        ("importance_sampling", {"logprobs": None}, {}, "needs loss_fn_inputs['logprobs']"),
        ("cross_entropy", {"weights": tensor([1.0])}, {}, "1 values for 6 target tokens"),
        ("ppo", {}, {"clip_low": 0.5}, "does not take loss_fn_config 'clip_low'"),
        ("dro", {}, {"beta": "big"}, "loss_fn_config['beta'] is a finite number"),
        ("gspo", {"sequence_ratio_mask": tensor([0.0] * 6)}, {}, "marks no token"),
        ("stable_reinforce", {"advantages": tensor([1.0] * 6)}, {}, "needs each datum's"),
    ],
)
def test_a_bad_request_is_a_loss_input_error(tiny_model, loss_fn, inputs, config, message):
    model = fresh(tiny_model)
    given = {name: value for name, value in inputs.items() if value is not None}
    dropped = {name for name, value in inputs.items() if value is None}
    batch = data(lambda n, i: {k: v for k, v in rl_inputs(n, i).items() if k not in dropped})[:1]
    batch[0]["inputs"] |= given
    with pytest.raises(LossInputError, match=re.escape(message)):
        model.forward_backward(batch, loss_fn, config)


def test_stable_reinforce_takes_no_advantage_on_a_prompt_position(tiny_model):
    model = fresh(tiny_model)
    [datum, _] = stable_batch()
    datum["inputs"]["advantages"]["data"][0] = 1.0
    with pytest.raises(LossInputError, match="advantages on sampled tokens only"):
        model.forward_backward([datum], "stable_reinforce", {})
