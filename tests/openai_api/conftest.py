import json

import openai
import pytest

CHAT_ROWS = [
    {
        "messages": [
            {"role": "system", "content": "You answer in one word."},
            {"role": "user", "content": f"Say {word}."},
            {"role": "assistant", "content": word},
        ]
    }
    for word in ("apple", "pear", "plum", "fig", "lime", "kiwi", "date", "melon")
]
PREFERENCE_ROWS = [
    {
        "input": {"messages": [{"role": "user", "content": f"Greet {name}."}]},
        "preferred_output": [{"role": "assistant", "content": f"Hello, {name}!"}],
        "non_preferred_output": [{"role": "assistant", "content": "No."}],
    }
    for name in ("Ada", "Bo", "Cy", "Di", "Ed", "Flo", "Gus", "Hal")
]


def jsonl(rows: list[dict]) -> bytes:
    return "".join(json.dumps(row) + "\n" for row in rows).encode()


def openai_client(live_server, raw_key: str) -> openai.OpenAI:
    """The official client, unmodified: only its base URL and key point at Veri."""
    return openai.OpenAI(api_key=raw_key, base_url=f"{live_server.url}/v1", max_retries=0)


@pytest.fixture
def client(live_server, api_client) -> openai.OpenAI:
    return openai_client(live_server, api_client.raw_key)
