"""What each method needs in a dataset row. Shared by the control plane (checked at upload and
submit) and the worker (checked again on the data it actually reads); imports nothing."""


def row_problem(method: str, row) -> str | None:
    """Why a dataset row cannot train `method`, or None when it can."""
    if not isinstance(row, dict):
        return "is not a JSON object"

    def is_messages(value) -> bool:
        return (
            isinstance(value, list)
            and bool(value)
            and all(
                isinstance(m, dict)
                and isinstance(m.get("role"), str)
                and isinstance(m.get("content"), str)
                for m in value
            )
        )

    def is_text(value) -> bool:
        return isinstance(value, str) and bool(value)

    if method == "sft_text":
        if is_text(row.get("text")) or is_messages(row.get("messages")):
            return None
        return 'needs "text" (a string) or "messages" (a list of {role, content})'
    if method == "dpo":
        for key in ("prompt", "chosen", "rejected"):
            if not (is_text(row.get(key)) or is_messages(row.get(key))):
                return f'needs "{key}" (a string or a list of {{role, content}})'
        return None
    if method == "grpo":
        if is_text(row.get("prompt")) or is_messages(row.get("prompt")):
            return None
        return 'needs "prompt" (a string or a list of {role, content})'
    raise ValueError(method)
