"""What `stable_reinforce` trains with: samples recorded at sampling time and the provenance
the client gives its training data.

A sample asked with `record_stability_info` is recorded: its operation (tokens and the logprobs
the sampler gave them, kept as its result, and its prompt in its payload) is marked usable until
a day later (`recorded_until`), and each training request that uses one of its sequences
restarts that day, as in Tinker. Nothing else is stored: a record is as large as its sample,
whose size the sampling limits cap. A sequence is `<request_id>:<index>`, the
`sample_sequence_ids` the sample's request answered.

A datum trained with `stable_reinforce` names, through its provenance spans, the sequence behind
each of its positions; here every claim is checked against the record (the named sequence
exists in the same session, whichever of its models sampled it, was recorded and has not
expired; the span fits in it; its tokens are the datum's) and the datum gets what the worker's
loss needs: per target position the sampler's recorded logprob and whether it is a sampled
token. The client's own `logprobs` input is not used: customer code could forge it."""

from datetime import timedelta

from django.utils import timezone

from tinker_api.models import OpKind, OpStatus, TinkerModel, TinkerOperation
from veri.errors import VeriError

RECORD_TTL = timedelta(days=1)
SPAN_KEYS = ("model_input_spans", "loss_fn_input_spans")
NEEDS_RECORDS = "stable_reinforce"


class ProvenanceError(VeriError):
    code = "invalid_provenance"

    def __init__(self, message: str):
        super().__init__(message, field="data")


def record(operation: TinkerOperation) -> None:
    """Keep a sample's sequences for stable_reinforce."""
    TinkerOperation.objects.filter(pk=operation.pk).update(
        recorded_until=timezone.now() + RECORD_TTL
    )


def prepare(*, model: TinkerModel, loss_fn: str, data: list[dict]) -> list[dict]:
    """The data as the worker takes it: for stable_reinforce each datum with its `recorded`
    logprobs and sampled positions (and the sequences it used kept another day); provenance is
    not passed on (other losses do not use it)."""
    if loss_fn != NEEDS_RECORDS:
        return [{k: v for k, v in datum.items() if k not in SPAN_KEYS} for datum in data]
    named = {
        span["sequence_id"] for datum in data for key in SPAN_KEYS for span in datum.get(key, ())
    }
    sequences = _sequences(model=model, named=named)
    prepared = [_with_record(index, datum, sequences) for index, datum in enumerate(data)]
    used = {operation.pk for operation, _ in sequences.values()}
    TinkerOperation.objects.filter(pk__in=used).update(recorded_until=timezone.now() + RECORD_TTL)
    return prepared


def _sequences(*, model: TinkerModel, named: set[str]) -> dict[str, tuple[TinkerOperation, int]]:
    """Each named sequence's recorded sample and index, in the model's session; any other (not
    found, another session's, another workspace's) is refused alike."""
    by_request: dict[str, list[tuple[str, int]]] = {}
    for sequence_id in named:
        request_id, _, index = sequence_id.rpartition(":")
        if not (index.isascii() and index.isdigit()) or not request_id:
            raise ProvenanceError(f"No sampled sequence {sequence_id} in this session.")
        by_request.setdefault(request_id, []).append((sequence_id, int(index)))
    samples = {
        operation.request_id: operation
        for operation in TinkerOperation.objects.filter(
            request_id__in=by_request, kind=OpKind.SAMPLE, model__session_id=model.session_id
        ).only("request_id", "status", "payload", "result", "recorded_until")
    }
    now, found = timezone.now(), {}
    for request_id, sequence_ids in sorted(by_request.items()):
        operation = samples.get(request_id)
        for sequence_id, index in sequence_ids:
            if operation is None or index >= operation.payload.get("num_samples", 0):
                raise ProvenanceError(f"No sampled sequence {sequence_id} in this session.")
            if operation.recorded_until is None:
                raise ProvenanceError(
                    f"Sequence {sequence_id} was not recorded: stable_reinforce trains on "
                    "samples from a sampling client made with record_stability_info=True."
                )
            if operation.recorded_until < now:
                raise ProvenanceError(
                    f"Sequence {sequence_id} has expired: a recorded sequence can be trained on "
                    "for a day after sampling or its last training use."
                )
            if operation.status != OpStatus.DONE:
                state = "failed" if operation.status == OpStatus.FAILED else "not finished"
                raise ProvenanceError(f"Sequence {sequence_id}'s sampling has {state}.")
            if index >= len((operation.result or {}).get("sequences") or []):
                raise ProvenanceError(f"No sampled sequence {sequence_id} in this session.")
            found[sequence_id] = (operation, index)
    return found


def _with_record(index: int, datum: dict, sequences: dict) -> dict:
    where = f"data[{index}]"
    if not all(datum.get(key) for key in SPAN_KEYS):
        raise ProvenanceError(
            f"{where} has no provenance: stable_reinforce needs each datum's "
            "(Datum.with_provenance, naming the sampled sequences behind its tokens)."
        )
    tokens = datum["tokens"]
    targets = datum["inputs"].get("target_tokens") or {}
    target_ids = targets.get("data") if len(targets.get("shape") or []) == 1 else None
    if target_ids is None or len(target_ids) != len(tokens):
        raise ProvenanceError(f"{where}: target_tokens needs one token per input token.")
    logprobs, sampled = [], []
    for key, ids in (("model_input_spans", tokens), ("loss_fn_input_spans", target_ids)):
        at = 0
        for span in datum[key]:
            if at + span["length"] > len(tokens):
                raise ProvenanceError(
                    f"{where}: its {key} cover more positions than its {len(tokens)} tokens."
                )
            operation, seq = sequences[span["sequence_id"]]
            start, end = span["offset"], span["offset"] + span["length"]
            if span["kind"] == "prompt":
                source = operation.payload["tokens"]
            else:
                source = operation.result["sequences"][seq]["tokens"]
            if end > len(source):
                raise ProvenanceError(
                    f"{where}: a {span['kind']} span of {span['sequence_id']} ends at {end}, "
                    f"past its {len(source)} {span['kind']} tokens."
                )
            checked = key == "model_input_spans" or span["kind"] == "sampled"
            if checked and ids[at : at + span["length"]] != source[start:end]:
                what = "model_input" if key == "model_input_spans" else "target_tokens"
                raise ProvenanceError(
                    f"{where}: {what} positions {at} to {at + span['length'] - 1} are not the "
                    f"{span['kind']} tokens {start} to {end - 1} of {span['sequence_id']}."
                )
            if key == "loss_fn_input_spans":
                is_sampled = span["kind"] == "sampled"
                recorded = operation.result["sequences"][seq]["logprobs"][start:end]
                logprobs += recorded if is_sampled else [0.0] * span["length"]
                sampled += [1 if is_sampled else 0] * span["length"]
            at += span["length"]
        if at != len(tokens):
            raise ProvenanceError(
                f"{where}: its {key} cover {at} positions, not its {len(tokens)} tokens."
            )
    kept = {k: v for k, v in datum.items() if k not in SPAN_KEYS}
    return kept | {"recorded": {"logprobs": logprobs, "sampled": sampled}}
