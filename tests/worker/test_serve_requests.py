"""The serving process (worker.serve) on the tiny model, over real HTTP: every malformed request
is answered 400 (404 for an unknown model) in OpenAI's error shape, never a 500, the sampling
parameters do what they say, and nothing is served without the replica's serving key."""

from http.server import ThreadingHTTPServer

import httpx
import pytest

from tests.conftest import serve_in_background
from worker.serve import Engine, handler_for

CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "Name a fruit."}]}
PROMPT = {"model": "tiny", "prompt": "A plum is"}
KEY = "veri_srv_test"


@pytest.fixture(scope="module")
def server(tiny_model):
    """A client of the server that bears its key, as the router does."""
    engine = Engine(tiny_model, {}, "tiny")
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler_for(engine, KEY))
    serve_in_background(httpd)
    url = f"http://127.0.0.1:{httpd.server_address[1]}"
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {KEY}"}) as client:
        yield client
    httpd.shutdown()


def test_nothing_is_served_without_the_serving_key(server):
    url = str(server.base_url).rstrip("/")
    for headers in ({}, {"Authorization": "Bearer veri_srv_other"}, {"Authorization": KEY}):
        chat = httpx.post(f"{url}/v1/chat/completions", json=CHAT, headers=headers, timeout=60)
        assert chat.status_code == 401, chat.text
        assert chat.json()["error"]["message"] == "A serving key is required."
        assert httpx.get(f"{url}/v1/models", headers=headers).status_code == 401
    assert httpx.get(f"{url}/health").status_code == 200  # the machine's own probe
    assert server.get("/v1/models").json()["data"][0]["id"] == "tiny"


BAD_CHAT = [
    ({"messages": CHAT["messages"]}, "model"),
    ({"model": 3, "messages": CHAT["messages"]}, "model"),
    (CHAT | {"messages": []}, "messages"),
    (CHAT | {"messages": "hi"}, "messages"),
    (CHAT | {"messages": [{"role": "wizard", "content": "x"}]}, "messages.[0].role"),
    (CHAT | {"messages": [{"role": "user", "content": 5}]}, "messages.[0].content"),
    (CHAT | {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, None),
    (CHAT | {"max_tokens": 0}, "max_tokens"),
    (CHAT | {"max_tokens": "5"}, "max_tokens"),
    (CHAT | {"max_tokens": True}, "max_tokens"),
    (CHAT | {"max_tokens": 10_000}, "max_tokens"),  # past the tiny model's 512-token context
    (CHAT | {"temperature": -1}, "temperature"),
    (CHAT | {"temperature": "hot"}, "temperature"),
    (CHAT | {"top_p": 0}, "top_p"),
    (CHAT | {"top_p": 1.5}, "top_p"),
    (CHAT | {"n": 0}, "n"),
    (CHAT | {"n": 9}, "n"),
    (CHAT | {"stop": ["a", "b", "c", "d", "e"]}, "stop"),
    (CHAT | {"stop": [""]}, "stop"),
    (CHAT | {"stop": 3}, "stop"),
    (CHAT | {"seed": "x"}, "seed"),
    (CHAT | {"stream": "yes"}, "stream"),
    (CHAT | {"logprobs": "yes"}, "logprobs"),
    (CHAT | {"top_logprobs": 2}, "top_logprobs"),
    (CHAT | {"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    (CHAT | {"presence_penalty": 1}, "presence_penalty"),
    (CHAT | {"stream_options": {"include_usage": "yes"}}, "stream_options"),
]
BAD_COMPLETION = [
    ({"model": "tiny"}, "prompt"),
    (PROMPT | {"prompt": [1, 2]}, "prompt"),
    (PROMPT | {"logprobs": 6}, "logprobs"),
    (PROMPT | {"echo": True}, "echo"),
    (PROMPT | {"max_tokens": -1}, "max_tokens"),
]


def assert_openai_error(response: httpx.Response, status: int, param) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert error["type"] == "invalid_request_error"
    if param is not None:
        assert error["param"] == param
    return error


@pytest.mark.parametrize(("body", "param"), BAD_CHAT)
def test_a_bad_chat_request_is_a_400_in_openais_shape(server, body, param):
    response = server.post("/v1/chat/completions", json=body, timeout=60)
    assert_openai_error(response, 400, param)


@pytest.mark.parametrize(("body", "param"), BAD_COMPLETION)
def test_a_bad_completion_request_is_a_400_in_openais_shape(server, body, param):
    response = server.post("/v1/completions", json=body, timeout=60)
    assert_openai_error(response, 400, param)


def test_bodies_that_are_not_requests_and_unknown_models(server):
    for content in (b"{not json", b"[1, 2]", b"null", '"\u00e9"'.encode()):
        response = server.post("/v1/chat/completions", content=content, timeout=60)
        assert_openai_error(response, 400, None)
    unknown = server.post("/v1/chat/completions", json=CHAT | {"model": "gpt-4"})
    assert assert_openai_error(unknown, 404, "model")["code"] == "model_not_found"


def test_sampling_is_seeded_stops_cut_and_n_counts(server):
    def complete(**fields) -> dict:
        body = PROMPT | {"max_tokens": 12} | fields
        response = server.post("/v1/completions", json=body, timeout=60)
        assert response.status_code == 200, response.text
        return response.json()

    seeded = complete(temperature=1.0, seed=7, n=3)
    assert len(seeded["choices"]) == 3
    assert seeded == complete(temperature=1.0, seed=7, n=3) | {
        k: seeded[k] for k in ("id", "created")
    }  # the same seed, the same texts
    one = complete(temperature=1.0, seed=7)["usage"]
    usage = seeded["usage"]
    assert usage["prompt_tokens"] == one["prompt_tokens"]  # the prompt counts once, whatever n
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    greedy = complete(temperature=0, logprobs=2)["choices"][0]
    assert len(greedy["logprobs"]["tokens"]) == len(greedy["logprobs"]["token_logprobs"])
    assert all(len(top) == 2 for top in greedy["logprobs"]["top_logprobs"])
    text = greedy["text"]
    stop = text[len(text) // 2 : len(text) // 2 + 2]
    cut = complete(temperature=0, stop=[stop])["choices"][0]
    assert cut["finish_reason"] == "stop" and cut["text"] == text[: text.index(stop)]
