"""The protobuf codec against the official client's own encoder and decoder."""

import numpy as np
import pytest
import torch
from tinker import types
from tinker.proto.request_conv import forward_backward_request_to_proto
from tinker.proto.response_conv import deserialize_forward_backward_output

from tinker_api import wire


def request(**loss) -> types.ForwardBackwardRequest:
    weights = torch.tensor([[0.0, 1.0, 0.0], [0.5, 0.0, 2.0]])
    data = [
        types.Datum(
            model_input=types.ModelInput.from_ints([5, 6, 7]),
            loss_fn_inputs={"target_tokens": [6, 7, 8], "weights": [0.0, 1.0, 1.0]},
        ),
        types.Datum(
            model_input=types.ModelInput.from_ints([1, 2]),
            loss_fn_inputs={
                "target_tokens": np.array([2, 3]),
                "advantages": np.array([0.25, -1.5], dtype=np.float32),
                "weights": weights,  # 2-D: the client sends it sparse
            },
        ),
    ]
    return types.ForwardBackwardRequest(
        forward_backward_input=types.ForwardBackwardInput(data=data, **loss),
        model_id="tses_x:train:0",
        seq_id=3,
    )


def test_a_request_the_client_encodes_decodes_to_its_tokens_inputs_and_config():
    message = forward_backward_request_to_proto(
        request(loss_fn="ppo", loss_fn_config={"clip_low_threshold": 0.9, "note": "x"})
    )
    message.forward_only = True
    decoded = wire.decode_forward_backward(message.SerializeToString())
    assert decoded["model_id"] == "tses_x:train:0"
    assert (decoded["seq_id"], decoded["loss_fn"], decoded["forward_only"]) == (3, "ppo", True)
    assert decoded["loss_fn_config"] == {"clip_low_threshold": 0.9, "note": "x"}
    first, second = decoded["data"]
    assert first["tokens"] == [5, 6, 7]
    assert first["inputs"]["target_tokens"] == {"dtype": "int64", "shape": [3], "data": [6, 7, 8]}
    assert first["inputs"]["weights"]["data"] == [0.0, 1.0, 1.0]
    assert second["inputs"]["advantages"]["data"] == [0.25, -1.5]
    assert second["inputs"]["weights"] == {
        "dtype": "float32",
        "shape": [2, 3],
        "data": [0.0, 1.0, 0.0, 0.5, 0.0, 2.0],
    }


def test_provenance_the_client_encodes_decodes_to_its_spans():
    sequence = "treq_abc:3"
    datum = types.Datum(
        model_input=types.ModelInput.from_ints([5, 6, 7]),
        loss_fn_inputs={"target_tokens": [6, 7, 8]},
    ).with_provenance(
        model_input=[
            types.PromptProvenanceSpan(sequence_id=sequence, length=2),
            types.SampledProvenanceSpan(sequence_id=sequence, length=1),
        ],
        loss_fn_inputs=[
            types.PromptProvenanceSpan(sequence_id=sequence, offset=1, length=1),
            types.SampledProvenanceSpan(sequence_id=sequence, offset=0, length=2),
        ],
    )
    message = forward_backward_request_to_proto(
        types.ForwardBackwardRequest(
            forward_backward_input=types.ForwardBackwardInput(
                data=[datum], loss_fn="stable_reinforce"
            ),
            model_id="tses_x:train:0",
            seq_id=1,
        )
    )
    [decoded] = wire.decode_forward_backward(message.SerializeToString())["data"]
    assert decoded["model_input_spans"] == [
        {"kind": "prompt", "sequence_id": sequence, "offset": 0, "length": 2},
        {"kind": "sampled", "sequence_id": sequence, "offset": 0, "length": 1},
    ]
    assert decoded["loss_fn_input_spans"] == [
        {"kind": "prompt", "sequence_id": sequence, "offset": 1, "length": 1},
        {"kind": "sampled", "sequence_id": sequence, "offset": 0, "length": 2},
    ]
    message.data[0].loss_fn_input_spans[0].prompt_tokens.offset = -1  # int32: what the SDK forbids
    with pytest.raises(wire.WireError, match="non-negative"):
        wire.decode_forward_backward(message.SerializeToString())


def test_an_output_decodes_in_the_client_to_the_same_tensors_and_metrics():
    result = {
        "loss_fn_outputs": [
            {"logprobs": {"dtype": "float32", "shape": [3], "data": [-1.0, -0.5, -2.25]}},
            {"logprobs": {"dtype": "float32", "shape": [1], "data": [-3.0]}},
        ],
        "metrics": {"loss:sum": 6.75},
    }
    output = deserialize_forward_backward_output(wire.encode_forward_backward_output(result))
    assert output.metrics == {"loss:sum": 6.75}
    assert [o["logprobs"].tolist() for o in output.loss_fn_outputs] == [[-1.0, -0.5, -2.25], [-3.0]]


@pytest.mark.parametrize(
    "body", [b"\x1a\x05ab", b"\x0f", b"\x12\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff"]
)
def test_a_malformed_body_is_a_request_error_not_a_crash(body):
    with pytest.raises(wire.WireError):
        wire.decode_forward_backward(body)
