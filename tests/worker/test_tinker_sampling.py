"""The Tinker worker's sampling on the tiny model: a sample uses the weights snapshotted at its
save and puts the model's own back; stops (token ids, strings, the end of sequence) stop it."""

import pytest
import torch

from tests.worker.test_tinker_losses import fresh
from worker.tinker_losses import LossInputError

PROMPT = [5, 17, 42]


def sample(model, seq_id=1, n=2, **params) -> list[dict]:
    params = {"max_tokens": 6, "seed": 3, "stop": []} | params
    payload = {"tokens": PROMPT, "num_samples": n, "sampling_params": params}
    return model.sample(seq_id, payload)["sequences"]


def test_a_sample_uses_its_snapshot_and_leaves_the_trained_weights(tiny_model):
    model = fresh(tiny_model)
    model.snapshot(1)
    before = sample(model)
    assert [len(s["tokens"]) for s in before] == [6, 6]
    assert {s["stop_reason"] for s in before} == {"length"}
    with torch.no_grad():  # training moves the LoRA on
        for param in model.params:
            param.add_(0.5)
    trained = [p.detach().clone() for p in model.params]
    assert sample(model) == before  # the snapshot's weights, seeded: the same draws
    assert all(torch.equal(p, q) for p, q in zip(model.params, trained, strict=True))
    model.snapshot(2)
    assert sample(model, seq_id=2) != before


def test_stops_end_a_sample(tiny_model):
    model = fresh(tiny_model)
    model.snapshot(1)
    [free] = sample(model, n=1, temperature=0)
    token = free["tokens"][2]
    cut = free["tokens"][: free["tokens"].index(token) + 1]
    [stopped] = sample(model, n=1, temperature=0, stop=[token])
    assert (stopped["tokens"], stopped["stop_reason"]) == (cut, "stop")
    text = model.tokenizer.decode(cut)
    [by_text] = sample(model, n=1, temperature=0, stop=text[-1])
    assert by_text["stop_reason"] == "stop" and text[-1] in model.tokenizer.decode(
        by_text["tokens"]
    )
    assert len(by_text["tokens"]) <= len(cut)


def test_a_prompt_outside_the_vocabulary_is_the_callers_error(tiny_model):
    model = fresh(tiny_model)
    payload = {"tokens": [10**6], "num_samples": 1, "sampling_params": {"max_tokens": 2}}
    with pytest.raises(LossInputError, match="0 to"):
        model.sample(1, payload)


def test_the_end_of_sequence_stops_a_sample_unless_stop_is_empty(tiny_model):
    """As Tinker's SamplingParams say: absent `stop`, or with stop strings (a chat format's, which
    a base model's turn may not reach), the end-of-sequence token stops too; `[]` stops nothing."""
    model = fresh(tiny_model)
    model.snapshot(1)
    [free] = sample(model, n=1, temperature=0)
    model.eos = free["tokens"][2]  # the model's end of sequence: the third token greedy draws
    cut = free["tokens"][: free["tokens"].index(model.eos) + 1]
    for stop in (None, ["never said"]):
        [stopped] = sample(model, n=1, temperature=0, stop=stop)
        assert (stopped["tokens"], stopped["stop_reason"]) == (cut, "stop"), stop
    assert sample(model, n=1, temperature=0) == [free]
