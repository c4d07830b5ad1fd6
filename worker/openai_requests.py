"""The OpenAI inference subset a serving process answers, checked: a request's body becomes a
`Generation`, or a `BadRequest` the server answers 400 in OpenAI's error shape. Nothing here
loads a model (the serving process's tests check requests without torch)."""

from dataclasses import dataclass, field

from worker.formats import chat

MAX_N = 8
MAX_STOPS = 4
MAX_TOP_LOGPROBS = 20
MAX_COMPLETION_LOGPROBS = 5
ROLES = {"system", "developer", "user", "assistant", "tool"}
# Accepted and ignored: they change nothing a small server does (tracking, caching, tools off).
IGNORED = {
    "user",
    "store",
    "metadata",
    "service_tier",
    "stream_options",
    "logit_bias",
    "parallel_tool_calls",
    "prompt_cache_key",
    "safety_identifier",
}


class BadRequest(Exception):
    """A request the server refuses: OpenAI's `invalid_request_error` (404 for an unknown model)."""

    def __init__(
        self, message: str, *, param: str | None = None, code: str | None = None, status: int = 400
    ):
        super().__init__(message)
        self.message, self.param, self.code, self.status = message, param, code, status

    def body(self) -> dict:
        kind = "invalid_request_error"
        return {
            "error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}
        }


@dataclass(frozen=True, slots=True)
class Generation:
    kind: str  # "chat" | "completion"
    model: str
    messages: list[dict] = field(default_factory=list)  # chat
    prompt: str = ""  # completion
    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    n: int = 1
    stop: tuple[str, ...] = ()
    seed: int | None = None
    stream: bool = False
    include_usage: bool = False
    logprobs: bool = False
    top_logprobs: int = 0


def _int(body: dict, name: str, default, low: int, high: int):
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequest(f"{name} must be an integer.", param=name)
    if not low <= value <= high:
        raise BadRequest(f"{name} must be between {low} and {high}, not {value}.", param=name)
    return value


def _number(
    body: dict, name: str, default: float, low: float, high: float, *, open_low: bool = False
) -> float:
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise BadRequest(f"{name} must be a number.", param=name)
    if value > high or value < low or (open_low and value == low):
        bound = f"greater than {low}" if open_low else f"at least {low}"
        raise BadRequest(f"{name} must be {bound} and at most {high}, not {value}.", param=name)
    return float(value)


def _bool(body: dict, name: str) -> bool:
    value = body.get(name, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise BadRequest(f"{name} must be a boolean.", param=name)
    return value


def _stop(body: dict) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise BadRequest("stop must be a non-empty string or a list of them.", param="stop")
    if len(stops) > MAX_STOPS:
        raise BadRequest(f"stop takes at most {MAX_STOPS} sequences.", param="stop")
    return tuple(stops)


def _unsupported(body: dict, names: dict[str, object]) -> None:
    """Parameters this server cannot honour are refused unless left at their no-op value."""
    for name, neutral in names.items():
        if body.get(name) not in (None, neutral):
            raise BadRequest(f"{name} is not supported by this model's server.", param=name)


def _messages(body: dict) -> list[dict]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages must be a non-empty list of messages.", param="messages")
    for index, message in enumerate(messages):
        where = f"messages.[{index}]"
        if not isinstance(message, dict) or message.get("role") not in ROLES:
            raise BadRequest(
                f"{where}.role must be one of {', '.join(sorted(ROLES))}.", param=f"{where}.role"
            )
        content = message.get("content")
        parts_ok = isinstance(content, list) and all(
            isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
            for p in content
        )
        if not (
            isinstance(content, str)
            or parts_ok
            or (content is None and message["role"] == "assistant")
        ):
            raise BadRequest(
                f"{where}.content must be text (a string, or a list of text parts).",
                param=f"{where}.content",
            )
    return chat(
        [
            {
                "role": "system" if m["role"] == "developer" else m["role"],
                "content": m.get("content"),
            }
            for m in messages
        ]
    )


def parse(kind: str, body, models: set[str]) -> Generation:
    """The request `body` of a `kind` ("chat" or "completion") call, checked."""
    if not isinstance(body, dict):
        raise BadRequest("The request body must be a JSON object.")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise BadRequest("model is required.", param="model")
    if model not in models:
        raise BadRequest(
            f"The model {model[:200]!r} does not exist on this server.",
            param="model",
            code="model_not_found",
            status=404,
        )
    _unsupported(
        body,
        {
            "presence_penalty": 0,
            "frequency_penalty": 0,
            "tools": [],
            "tool_choice": "none",
            "response_format": {"type": "text"},
            "echo": False,
            "suffix": "",
            "best_of": 1,
        },
    )
    common = {
        "model": model,
        "temperature": _number(body, "temperature", 1.0, 0.0, 2.0),
        "top_p": _number(body, "top_p", 1.0, 0.0, 1.0, open_low=True),
        "n": _int(body, "n", 1, 1, MAX_N),
        "stop": _stop(body),
        "seed": _int(body, "seed", None, -(2**63), 2**63 - 1),
        "stream": _bool(body, "stream"),
    }
    options = body.get("stream_options")
    if options is not None:
        if not isinstance(options, dict) or not isinstance(
            options.get("include_usage", False), bool
        ):
            raise BadRequest(
                "stream_options must be an object with a boolean include_usage.",
                param="stream_options",
            )
        common["include_usage"] = options.get("include_usage", False)
    if kind == "chat":
        limit = body.get("max_completion_tokens", body.get("max_tokens"))
        logprobs = _bool(body, "logprobs")
        top = _int(body, "top_logprobs", 0, 0, MAX_TOP_LOGPROBS)
        if top and not logprobs:
            raise BadRequest("top_logprobs needs logprobs: true.", param="top_logprobs")
        return Generation(
            kind="chat",
            messages=_messages(body),
            max_tokens=_int({"max_tokens": limit}, "max_tokens", 256, 1, 1_000_000),
            logprobs=logprobs,
            top_logprobs=top,
            **common,
        )
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise BadRequest("prompt must be a string (or a list of one string).", param="prompt")
    top = _int(body, "logprobs", None, 0, MAX_COMPLETION_LOGPROBS)
    return Generation(
        kind="completion",
        prompt=prompt,
        max_tokens=_int(body, "max_tokens", 16, 1, 1_000_000),
        logprobs=top is not None,
        top_logprobs=top or 0,
        **common,
    )
