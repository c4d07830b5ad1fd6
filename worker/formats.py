"""Dataset rows (checked by worker.rows) as TRL's trainers take them.

- sft_text: every row is tokenized here into `input_ids` and `labels` (TRL 1.16 uses a
  pre-tokenized dataset's `labels` as they are). A chat row goes through the tokenizer's chat
  template, with its `tools`; only the tokens of assistant messages whose `weight` is not 0 keep
  their label, every other token is -100 (not in the loss). A text row is trained on whole.
- dpo: OpenAI's preference rows become TRL's conversational `prompt` / `chosen` / `rejected`
  (`tools` as JSON text, which TRL reads back).
- grpo: OpenAI's reinforcement rows become `prompt` (their messages); every other field stays a
  column, so the reward functions get it as a keyword argument, `messages` included.

Messages reach the chat template as `role` and `content` text (text parts joined, null as ""),
with `tool_calls` (their JSON-text `arguments` as objects), `tool_call_id` and `name` when the
customer gave them.
"""

import json

from worker.rows import trained

IGNORED = -100  # a label the loss skips


def text_of(content) -> str:
    if content is None:
        return ""
    if isinstance(content, list):
        return "".join(part["text"] for part in content)
    return content


def _arguments(arguments):
    """A tool call's arguments as an object, as Hugging Face chat templates render them (OpenAI
    writes them as JSON text); text that is not a JSON object stays text."""
    if isinstance(arguments, str):
        try:
            parsed = json.loads(arguments)
        except ValueError:
            return arguments
        return parsed if isinstance(parsed, dict) else arguments
    return arguments


def chat(messages: list[dict]) -> list[dict]:
    """Messages as chat templates read them."""
    out = []
    for message in messages:
        plain = {"role": message["role"], "content": text_of(message.get("content"))}
        plain |= {k: message[k] for k in ("tool_call_id", "name") if k in message}
        if "tool_calls" in message:
            plain["tool_calls"] = [
                {
                    **call,
                    "function": {
                        **call["function"],
                        "arguments": _arguments(call["function"].get("arguments", {})),
                    },
                }
                for call in message["tool_calls"]
            ]
        out.append(plain)
    return out


def _common_prefix(ids: list[int], other: list[int]) -> int:
    length = 0
    for a, b in zip(ids, other, strict=False):
        if a != b:
            break
        length += 1
    return length


def supervised_example(row: dict, tokenizer, max_length: int) -> dict:
    """`input_ids` and `labels` for one sft_text row, cut to `max_length` tokens.

    A chat row is rendered whole, then each trained assistant message's tokens are found as the
    part of the whole that its conversation so far adds after the generation prompt (a template
    that renders earlier turns differently from the whole is matched by common prefix, as TRL
    does for prompts and completions)."""
    if "messages" not in row:
        text = row["text"]
        if not text.endswith(tokenizer.eos_token):
            text += tokenizer.eos_token
        ids = tokenizer(text=text)["input_ids"]
        return {"input_ids": ids[:max_length], "labels": ids[:max_length]}
    messages, tools = chat(row["messages"]), row.get("tools") or None

    def render(part: list[dict], generation: bool) -> list[int]:
        return tokenizer.apply_chat_template(
            part, tools=tools, tokenize=True, return_dict=True, add_generation_prompt=generation
        )["input_ids"]

    ids = render(messages, False)
    labels = [IGNORED] * len(ids)
    for index, message in enumerate(row["messages"]):
        if trained(message):
            start = _common_prefix(render(messages[:index], True), ids) if index else 0
            end = _common_prefix(render(messages[: index + 1], False), ids)
            labels[start:end] = ids[start:end]
    return {"input_ids": ids[:max_length], "labels": labels[:max_length]}


def preference_row(row: dict) -> dict:
    if "input" not in row:
        return {
            k: chat(row[k]) if isinstance(row[k], list) else row[k]
            for k in ("prompt", "chosen", "rejected")
        }
    given = row["input"]
    converted = {
        "prompt": chat(given["messages"]),
        "chosen": chat(row["preferred_output"]),
        "rejected": chat(row["non_preferred_output"]),
    }
    if given.get("tools"):
        converted["tools"] = json.dumps(given["tools"])
    return converted


def reinforcement_row(row: dict) -> dict:
    if "prompt" in row:
        return row
    messages = chat(row["messages"])
    return {**row, "prompt": messages, "messages": messages}
