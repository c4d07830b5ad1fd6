"""StableReinforce's control plane: a sample asked with `record_stability_info` is recorded, and a
`stable_reinforce` request's provenance is checked against the record and turned into what the
worker trains with: the logprobs the sampler recorded, not the ones the client sends. A claim
the record does not back is a 400 the client raises."""

from datetime import timedelta

import pytest
from django.utils import timezone
from tinker import types
from tinker.proto.request_conv import forward_backward_request_to_proto

from tests.conftest import assert_error
from tests.tinker_api.test_api import (  # noqa: F401 - quick and tk are fixtures
    new_model,
    next_op,
    quick,
    tk,
    worker,
)
from tests.tinker_api.test_sampling import asample, finish
from tinker_api.models import TinkerOperation

pytestmark = pytest.mark.django_db

PROMPT, SAMPLED, RECORDED = [5, 6], [7, 8, 9], [-0.5, -1.5, -2.5]


def sampler(client):
    """A model with a sampler (its save at seq 1, run) and the model's worker."""
    model = new_model(client)
    w = worker(model)
    finish(w, next_op(w, -1).json()["operation"])
    body = {"model_id": model.model_id, "seq_id": 1}
    client.post("/api/v1/save_weights_for_sampler", body, format="json")
    finish(w, next_op(w, 0).json()["operation"])
    return model, w


def draw(client, model, w, *, record=True) -> str:
    """The sampler draws SAMPLED (RECORDED its logprobs) after PROMPT: that sequence's id."""
    change = {"record_stability_info": True} if record else {}
    queued = asample(client, f"{model.model_id}:sample:1", **change).json()
    sample = next_op(w, 1).json()["operation"]
    other = {"tokens": [1], "logprobs": [-0.1], "stop_reason": "stop"}
    mine = {"tokens": SAMPLED, "logprobs": RECORDED, "stop_reason": "length"}
    finish(w, sample, {"sequences": [mine, other]})
    return f"{queued['request_id']}:0"


def datum(sequence_id, *, targets=None, loss_spans=None, provenance=True) -> types.Datum:
    """rl_loop's datum for the sample: the prompt and all but the last sampled token in, the
    targets from the prompt's second token on (0s there, as rl_loop pads them); forged
    `logprobs` the loss must not read."""
    made = types.Datum(
        model_input=types.ModelInput.from_ints(PROMPT + SAMPLED[:-1]),
        loss_fn_inputs={
            "target_tokens": targets or [0, *SAMPLED],
            "logprobs": [0.0, 9.0, 9.0, 9.0],
            "advantages": [0.0, 1.0, 1.0, 1.0],
        },
    )
    if not provenance:
        return made
    return types.Datum(
        model_input=made.model_input,
        loss_fn_inputs=made.loss_fn_inputs,
        model_input_spans=[
            types.PromptProvenanceSpan(sequence_id=sequence_id, length=2),
            types.SampledProvenanceSpan(sequence_id=sequence_id, length=2),
        ],
        loss_fn_input_spans=loss_spans
        or [
            types.PromptProvenanceSpan(sequence_id=sequence_id, offset=1, length=1),
            types.SampledProvenanceSpan(sequence_id=sequence_id, length=3),
        ],
    )


def train(client, model, seq_id, *data: types.Datum, loss_fn="stable_reinforce"):
    request = types.ForwardBackwardRequest(
        forward_backward_input=types.ForwardBackwardInput(data=list(data), loss_fn=loss_fn),
        model_id=model.model_id,
        seq_id=seq_id,
    )
    body = forward_backward_request_to_proto(request).SerializeToString()
    return client.post("/api/v1/forward_backward", body, content_type="application/x-protobuf")


def test_stable_reinforce_trains_with_the_recorded_logprobs_and_keeps_them_a_day(tk):  # noqa: F811
    model, w = sampler(tk)
    sequence = draw(tk, model, w)
    sample = TinkerOperation.objects.get(request_id=sequence.split(":")[0])
    TinkerOperation.objects.filter(pk=sample.pk).update(
        recorded_until=timezone.now() + timedelta(hours=1)
    )
    response = train(tk, model, 2, datum(sequence))
    assert response.status_code == 200, response.json()

    operation = next_op(w, 1).json()["operation"]
    assert operation["kind"] == "forward_backward"
    [sent] = operation["payload"]["data"]
    assert sent["recorded"] == {"logprobs": [0.0, *RECORDED], "sampled": [0, 1, 1, 1]}
    assert set(sent) == {"tokens", "inputs", "recorded"}  # no provenance passed on
    sample.refresh_from_db()
    assert sample.recorded_until > timezone.now() + timedelta(hours=23)  # its day restarted

    # Other losses ignore provenance (the cookbook attaches it whenever it has sequence ids).
    response = train(tk, model, 3, datum(sequence), loss_fn="importance_sampling")
    assert response.status_code == 200, response.json()
    assert "recorded" not in next_op(w, 2).json()["operation"]["payload"]["data"][0]


def test_a_claim_the_record_does_not_back_is_a_400(tk):  # noqa: F811
    model, w = sampler(tk)
    sequence, unrecorded = draw(tk, model, w), draw(tk, model, w, record=False)
    request_id = sequence.split(":")[0]
    other_model, other_worker = sampler(tk)  # another session's (new_model opens one)
    elsewhere = draw(tk, other_model, other_worker)
    assert other_model.session_id != model.session_id
    spans = types.SampledProvenanceSpan
    prompt = types.PromptProvenanceSpan(sequence_id=sequence, offset=1, length=1)
    cases = {
        "treq_nope:0 in this session": datum("treq_nope:0"),
        f"{request_id}:\u00b2 in this session": datum(f"{request_id}:\u00b2"),  # not a number
        f"{request_id}:7 in this session": datum(f"{request_id}:7"),  # past the sample's
        f"{elsewhere} in this session": datum(elsewhere),
        "was not recorded": datum(unrecorded),
        "has no provenance": datum(sequence, provenance=False),
        "cover 3 positions, not its 4": datum(
            sequence, loss_spans=[prompt, spans(sequence_id=sequence, length=2)]
        ),
        "ends at 4, past its 3 sampled tokens": datum(
            sequence, loss_spans=[prompt, spans(sequence_id=sequence, offset=1, length=3)]
        ),
        "positions 1 to 3 are not the sampled tokens": datum(sequence, targets=[0, 7, 8, 1]),
    }
    for seq_id, (message, bad) in enumerate(cases.items(), start=2):
        error = assert_error(train(tk, model, seq_id, bad), 400, "invalid_provenance", "data")
        assert message in error["message"], error
    assert not model.operations.filter(kind="forward_backward").exists()

    TinkerOperation.objects.filter(request_id=request_id).update(
        recorded_until=timezone.now() - timedelta(seconds=1)
    )
    error = assert_error(train(tk, model, 20, datum(sequence)), 400, "invalid_provenance")
    assert "expired" in error["message"]
