"""The two protobuf messages of the Tinker wire that are not JSON: the `forward_backward` request
the client sends (`application/x-protobuf`) and the `ForwardBackwardOutput` a future answers
with. Field numbers are those of `tinker/proto/tinker_public.proto` (tinker 0.38); a small codec
here keeps the control plane free of the SDK and of protobuf. Tensors travel to and from the
worker as JSON: `{"dtype": "float32" | "int64", "shape": [...], "data": [...]}`."""

import math
import struct
from array import array

from veri.errors import VeriError

FLOAT32, INT64, INT32 = 1, 2, 3
DTYPES = {FLOAT32: ("float32", "f"), INT64: ("int64", "q"), INT32: ("int64", "i")}
CODES = {"float32": (FLOAT32, "f"), "int64": (INT64, "q")}


class WireError(VeriError):
    code = "invalid_request"


def _varint(buf: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if at >= len(buf):
            raise WireError("The protobuf body is truncated.")
        byte = buf[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, at
        shift += 7
        if shift > 63:
            raise WireError("The protobuf body holds a malformed varint.")


def fields(buf: bytes) -> list[tuple[int, int | bytes]]:
    """(field number, value) in order: an int for varints and fixed64 (raw bits), bytes for
    length-delimited fields."""
    out, at = [], 0
    while at < len(buf):
        key, at = _varint(buf, at)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, at = _varint(buf, at)
        elif wire == 1:
            value, at = int.from_bytes(buf[at : at + 8], "little"), at + 8
        elif wire == 2:
            length, at = _varint(buf, at)
            value, at = buf[at : at + length], at + length
            if at > len(buf):
                raise WireError("The protobuf body is truncated.")
        elif wire == 5:
            value, at = int.from_bytes(buf[at : at + 4], "little"), at + 4
        else:
            raise WireError(f"The protobuf body uses wire type {wire}, which Tinker does not.")
        out.append((number, value))
    return out


def _ints(value: int | bytes) -> list[int]:
    """A repeated integer field's entry: packed (bytes) or one varint."""
    if isinstance(value, int):
        return [value]
    found, at = [], 0
    while at < len(value):
        item, at = _varint(value, at)
        found.append(item)
    return found


def _array(data: bytes, typecode: str) -> list:
    values = array(typecode)
    if len(data) % values.itemsize:
        raise WireError("A tensor's bytes do not fit its dtype.")
    values.frombytes(data)
    return values.tolist()


def _tensor(buf: bytes) -> dict:
    dense, sparse, dtype, shape = None, None, 0, []
    for number, value in fields(buf):
        if number == 1:
            dense = value
        elif number == 2:
            sparse = {n: v for n, v in fields(value)}
        elif number == 3:
            dtype = value
        elif number == 4:
            shape += _ints(value)
    if dtype not in DTYPES:
        raise WireError(f"Tensor dtype {dtype} is not one Veri takes (float32, int64, int32).")
    name, typecode = DTYPES[dtype]
    if sparse is not None:  # CSR: every entry not listed is 0
        values = _array(sparse.get(1, b""), typecode)
        crow, cols = _array(sparse.get(2, b""), "q"), _array(sparse.get(3, b""), "q")
        if len(shape) != 2 or len(crow) != shape[0] + 1 or len(cols) != len(values):
            raise WireError("A sparse tensor's indices do not match its shape.")
        data = [0] * (shape[0] * shape[1])
        for row in range(shape[0]):
            for k in range(crow[row], crow[row + 1]):
                data[row * shape[1] + cols[k]] = values[k]
    else:
        data = _array(dense or b"", typecode)
        shape = shape or [len(data)]
    return {"dtype": name, "shape": shape, "data": data}


SPAN_KINDS = {1: "prompt", 2: "sampled"}
MAX_SEQUENCE_ID = 200


def _span(buf: bytes) -> dict:
    """A ProvenanceSpan: `{kind: "prompt" | "sampled", sequence_id, offset, length}`."""
    entries = fields(buf)
    if len(entries) != 1 or entries[0][0] not in SPAN_KINDS or isinstance(entries[0][1], int):
        raise WireError("A provenance span is a prompt or a sampled span.")
    number, arm = entries[0]
    values = dict(fields(arm))
    try:
        sequence_id = values.get(1, b"").decode()
    except (AttributeError, UnicodeDecodeError) as exc:
        raise WireError("A provenance span's sequence_id is text.") from exc
    offset, length = values.get(2, 0), values.get(3, 0)
    if not all(isinstance(v, int) and 0 <= v < 2**31 for v in (offset, length)):
        raise WireError("A provenance span's offset and length are non-negative int32s.")
    if not 0 < len(sequence_id) <= MAX_SEQUENCE_ID:
        raise WireError("A provenance span names a sequence_id.")
    return {
        "kind": SPAN_KINDS[number],
        "sequence_id": sequence_id,
        "offset": offset,
        "length": length,
    }


def _datum(buf: bytes) -> dict:
    """`{tokens, inputs}`, with the client's provenance (`Datum.with_provenance`) as
    `model_input_spans` and `loss_fn_input_spans` when it sent some."""
    tokens, inputs, spans = [], {}, {}
    for number, value in fields(buf):
        if number == 1:
            for kind, chunk in fields(value):
                if kind != 1:
                    raise WireError(
                        "Only encoded text chunks are supported; images and audio are not."
                    )
                tokens += _array(dict(fields(chunk)).get(1, b""), "i")
        elif number == 2:
            entry = dict(fields(value))
            inputs[entry.get(1, b"").decode()] = _tensor(entry.get(2, b""))
        elif number in (3, 4) and isinstance(value, bytes):
            name = "model_input_spans" if number == 3 else "loss_fn_input_spans"
            spans.setdefault(name, []).append(_span(value))
    return {"tokens": tokens, "inputs": inputs, **spans}


def prompt_tokens(prompt: dict) -> list[int]:
    """A JSON `ModelInput` (`asample`'s prompt): its encoded text chunks' tokens, in order."""
    tokens = []
    for chunk in prompt.get("chunks") or []:
        if not isinstance(chunk, dict) or chunk.get("type", "encoded_text") != "encoded_text":
            raise WireError("Only encoded text chunks are supported; images and audio are not.")
        ids = chunk.get("tokens")
        if not isinstance(ids, list) or not all(
            isinstance(t, int) and not isinstance(t, bool) and 0 <= t < 2**31 for t in ids
        ):
            raise WireError("A chunk's tokens are non-negative integers.", field="prompt")
        tokens += ids
    if not tokens:
        raise WireError("The prompt has no tokens.", field="prompt")
    return tokens


def decode_forward_backward(body: bytes) -> dict:
    """`{model_id, seq_id, loss_fn, loss_fn_config, forward_only, data: [{tokens, inputs}]}`."""
    out = {"model_id": "", "seq_id": 0, "loss_fn": "", "loss_fn_config": {}, "data": []}
    out["forward_only"] = False
    legacy = {}
    for number, value in fields(body):
        if number == 1:
            out["model_id"] = value.decode()
        elif number == 2:
            out["seq_id"] = value
        elif number == 3:
            out["data"].append(_datum(value))
        elif number == 4:
            out["loss_fn"] = value.decode()
        elif number == 5:
            entry = dict(fields(value))
            legacy[entry.get(1, b"").decode()] = struct.unpack(
                "<d", entry.get(2, 0).to_bytes(8, "little")
            )[0]
        elif number == 6:
            out["forward_only"] = bool(value)
        elif number == 7:
            entry = dict(fields(value))
            config = dict(fields(entry.get(2, b"")))
            if 2 in config:
                out["loss_fn_config"][entry.get(1, b"").decode()] = config[2].decode()
            else:
                bits = config.get(1, 0)
                out["loss_fn_config"][entry.get(1, b"").decode()] = struct.unpack(
                    "<d", bits.to_bytes(8, "little")
                )[0]
    out["loss_fn_config"] = legacy | out["loss_fn_config"]  # v2 wins, as Tinker's servers do
    return out


def _key(number: int, wire: int) -> bytes:
    return _varint_bytes(number << 3 | wire)


def _varint_bytes(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _length_delimited(number: int, payload: bytes) -> bytes:
    return _key(number, 2) + _varint_bytes(len(payload)) + payload


def _batched(tensors: list[dict]) -> bytes:
    """A field of every datum as one BatchedTensor: the data back to back, byte offsets."""
    dtype = tensors[0]["dtype"]
    code, typecode = CODES[dtype]
    data, offsets = array(typecode), array("q", [0])
    for tensor in tensors:
        data.extend(array(typecode, tensor["data"]))
        offsets.append(len(data) * data.itemsize)
    trailing = tensors[0]["shape"][1:]
    body = _length_delimited(1, data.tobytes()) + _length_delimited(2, offsets.tobytes())
    body += _key(3, 0) + _varint_bytes(code)
    if trailing:
        body += _length_delimited(4, b"".join(_varint_bytes(n) for n in trailing))
    return body


def encode_forward_backward_output(result: dict) -> bytes:
    """A `ForwardBackwardOutput` of `{loss_fn_outputs: [{name: tensor}], metrics}`: one
    ArrayRecord holding every datum."""
    outputs = result["loss_fn_outputs"]
    body = _length_delimited(1, b"ArrayRecord")
    record = b""
    for name in outputs[0] if outputs else ():
        entry = _length_delimited(1, name.encode()) + _length_delimited(
            2, _batched([o[name] for o in outputs])
        )
        record += _length_delimited(2, entry)
    record += _key(3, 0) + _varint_bytes(len(outputs))
    body += _length_delimited(2, record)
    for name, value in result["metrics"].items():
        entry = _length_delimited(1, name.encode()) + _key(2, 1) + struct.pack("<d", value)
        body += _length_delimited(3, entry)
    return body


STOP_REASONS = {"stop": 0, "length": 1}


def encode_sample_response(result: dict) -> bytes:
    """A `SampleResponse` of `{sequences: [{tokens, logprobs, stop_reason}], prompt_logprobs?}`
    (the SDK reads sampling results as protobuf only): int32 tokens and float32 logprobs as
    packed bytes; a prompt token without a logprob (the first) is NaN, which the SDK reads as
    None."""
    body = b""
    if (prompt := result.get("prompt_logprobs")) is not None:
        if not isinstance(prompt, list):
            raise TypeError("prompt_logprobs is a list")
        values = [math.nan if v is None else v for v in prompt]
        body += _length_delimited(2, array("f", values).tobytes())
    for sequence in result["sequences"]:
        tokens, logprobs = sequence["tokens"], sequence["logprobs"]
        if len(tokens) != len(logprobs):
            raise ValueError("a sequence has one logprob per token")
        entry = _key(1, 0) + _varint_bytes(STOP_REASONS[sequence["stop_reason"]])
        entry += _length_delimited(2, array("i", tokens).tobytes())
        entry += _length_delimited(3, array("f", logprobs).tobytes())
        body += _length_delimited(1, entry)
    return body
