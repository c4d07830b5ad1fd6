"""What each method needs in a dataset row. Shared by the control plane (checked at upload and
submit) and the worker (checked again on the data it actually reads); imports nothing.

Each problem reads on after "line N " (`line 3 has messages[1] with role "bot"; ...`): the
control plane and the worker both report it so.

Accepted rows, by method (docs/user-guide/methods.md shows them):
- sft_text: `{"text"}`, or a chat `{"messages", "tools"?, "parallel_tool_calls"?}` (OpenAI's
  supervised format: an assistant message may carry `weight` 0 or 1, and only assistant messages
  with a weight other than 0 are trained on).
- dpo: `{"prompt", "chosen", "rejected"}` (each text or messages), or OpenAI's preference format
  `{"input": {"messages", "tools"?, "parallel_tool_calls"?}, "preferred_output",
  "non_preferred_output"}`.
- grpo: `{"prompt", ...}`, or OpenAI's reinforcement format `{"messages", ...}` ending with a
  user or developer message; the other fields are reference fields the reward reads.
"""

ROLES = ("system", "developer", "user", "assistant", "tool")


def _is_text(value) -> bool:
    return isinstance(value, str) and bool(value)


def _content_problem(content) -> str | None:
    if content is None or isinstance(content, str):
        return None
    if isinstance(content, list) and all(
        isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)
        for part in content
    ):
        return None
    return 'content that is not text, null or a list of {"type": "text", "text"} parts'


def _tool_calls_problem(calls) -> str | None:
    if not isinstance(calls, list) or not calls:
        return "tool_calls that is not a non-empty list"
    for index, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        if not (
            isinstance(function, dict)
            and _is_text(function.get("name"))
            and isinstance(function.get("arguments", ""), str | dict)
        ):
            return (
                f'tool_calls[{index}] that is not {{"type": "function", "function": {{"name", '
                '"arguments"}}'
            )
    return None


def _message_problem(message) -> str | None:
    """What is wrong with one message, phrased to follow `has <field>[i] with `."""
    if not isinstance(message, dict):
        return "a value that is not an object"
    role = message.get("role")
    if role not in ROLES:
        return f"role {str(role)[:40]!r}; roles are {', '.join(ROLES)}"
    if problem := _content_problem(message.get("content")):
        return problem
    if message.get("content") is None and not (role == "assistant" and message.get("tool_calls")):
        return "no content (only an assistant message with tool_calls may leave it null)"
    if "weight" in message:
        if role != "assistant":
            return f"a weight on a {role} message; only assistant messages have one"
        weight = message["weight"]
        if isinstance(weight, bool) or weight not in (0, 1):
            return f"weight {str(weight)[:20]}; use 0 (not trained on) or 1"
    if "tool_calls" in message:
        if role != "assistant":
            return f"tool_calls on a {role} message; only assistant messages make calls"
        if problem := _tool_calls_problem(message["tool_calls"]):
            return problem
    if role == "tool" and not _is_text(message.get("tool_call_id")):
        return "no tool_call_id (a tool message answers the call with that id)"
    return None


def _messages_problem(value, field: str) -> str | None:
    """None when `value` is a non-empty list of well-formed messages."""
    if not isinstance(value, list) or not value:
        return f'needs "{field}" to be a non-empty list of {{role, content}} messages'
    for index, message in enumerate(value):
        if problem := _message_problem(message):
            return f"has {field}[{index}] with {problem}"
    return None


def _tools_problem(holder: dict, prefix: str) -> str | None:
    tools = holder.get("tools")
    if tools is not None and not (
        isinstance(tools, list)
        and all(isinstance(t, dict) and isinstance(t.get("function"), dict) for t in tools)
    ):
        return f'has {prefix}tools that is not a list of {{"type": "function", "function"}}'
    if not isinstance(holder.get("parallel_tool_calls", False), bool):
        return f"has {prefix}parallel_tool_calls that is not true or false"
    return None


def _text_or_messages_problem(row: dict, key: str) -> str | None:
    if _is_text(row.get(key)):
        return None
    if isinstance(row.get(key), list):
        return _messages_problem(row[key], key)
    return f'needs "{key}" (a string or a list of {{role, content}})'


def trained(message: dict) -> bool:
    """Whether a message of a supervised chat row is trained on (OpenAI: weight defaults to 1)."""
    return message.get("role") == "assistant" and message.get("weight", 1) != 0


def _supervised_problem(row: dict) -> str | None:
    if _is_text(row.get("text")):
        return None
    if "messages" not in row:
        return 'needs "text" (a string) or "messages" (a list of {role, content})'
    if problem := _messages_problem(row["messages"], "messages") or _tools_problem(row, ""):
        return problem
    if not any(trained(m) for m in row["messages"]):
        return "has no assistant message to train on (none, or every one has weight 0)"
    return None


def _preference_problem(row: dict) -> str | None:
    if "input" not in row:  # Veri's own shape
        for key in ("prompt", "chosen", "rejected"):
            if problem := _text_or_messages_problem(row, key):
                return problem
        return None
    given = row["input"]
    if not isinstance(given, dict):
        return 'has "input" that is not an object with "messages"'
    if problem := _messages_problem(given.get("messages"), "input.messages") or _tools_problem(
        given, "input."
    ):
        return problem
    for key in ("preferred_output", "non_preferred_output"):
        if problem := _messages_problem(row.get(key), key):
            return problem
        if any(m["role"] != "assistant" for m in row[key]):
            return f"has {key} with a message that is not from the assistant"
    return None


def _reinforcement_problem(row: dict) -> str | None:
    if "prompt" in row:  # Veri's own shape; "messages" may then be a reference field
        return _text_or_messages_problem(row, "prompt")
    if "messages" not in row:
        return (
            'needs "prompt" (a string or a list of {role, content}) or "messages" (ending with a '
            "user message)"
        )
    if problem := _messages_problem(row["messages"], "messages"):
        return problem
    last = row["messages"][-1]["role"]
    if last not in ("user", "developer"):
        return (
            f"has messages ending with role {last!r}; a reinforcement row ends with a user or "
            "developer message, which the model answers"
        )
    return None


RULES = {
    "sft_text": _supervised_problem,
    "dpo": _preference_problem,
    "grpo": _reinforcement_problem,
}


def row_problem(method: str, row) -> str | None:
    """Why a dataset row cannot train `method`, or None when it can."""
    if method not in RULES:
        raise ValueError(method)
    if not isinstance(row, dict):
        return "is not a JSON object"
    return RULES[method](row)
