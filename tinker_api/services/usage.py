"""What a model's operations processed, kept as they are queued: the dashboard shows it (and
billing may price it) without reading payloads back."""

from tinker_api.models import TinkerOperation


def count_tokens(*, operation: TinkerOperation, data: list[dict]) -> None:
    """Records the input tokens of a forward(_backward) once (a retried request is the same
    operation, already counted)."""
    tokens = sum(len(datum["tokens"]) for datum in data)
    TinkerOperation.objects.filter(pk=operation.pk, tokens=0).update(tokens=tokens)
