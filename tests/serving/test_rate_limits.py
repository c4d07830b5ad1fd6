"""Per-workspace rate limits on the inference routes, against a live server: OpenAI's
`x-ratelimit-*` headers on every answer, 429 in OpenAI's shape with `retry-after` past a limit
(the official client waits it out and retries, then raises RateLimitError), an operator's
override, and never one request more than the limit under concurrent requests."""

import os
import subprocess
import sys
import threading
import time

import httpx
import openai
import pytest

from serving.models import RateLimit
from tests.conftest import REPO
from tests.openai_api.conftest import openai_client

pytestmark = pytest.mark.django_db(transaction=True)
BODY = {"model": "nothing-deployed", "messages": [{"role": "user", "content": "hi"}]}


def post(live_server, key: str, body: dict = BODY) -> httpx.Response:
    return httpx.post(
        f"{live_server.url}/v1/chat/completions",
        headers={"Authorization": f"Bearer {key}"},
        json=body,
        timeout=30,
    )


def drain(live_server, key: str) -> None:
    """Take every request the workspace has left, up to a 429 that leaves the next place at least
    half a second away: one refilled a few ms after the drain would admit the request that was
    to find the limit taken (a place comes back every 2 s at 30 a minute)."""
    while True:
        answer = post(live_server, key)
        if answer.status_code != 429:
            continue
        wait = int(answer.headers["retry-after-ms"]) / 1000
        if wait >= 0.5:
            return
        time.sleep(wait)


def test_past_the_limit_the_openai_client_retries_after_retry_after_then_raises(
    live_server, api_client, other_api_client, settings
):
    # A request every 2 s, 30 at once: each of the client's retries below waits out 2 s at most.
    settings.VERI_RATE_LIMIT_REQUESTS_PER_MINUTE = 30
    key = api_client.raw_key
    first = post(live_server, key)
    assert first.status_code == 404  # admitted, then routed: nothing serves that model
    assert first.headers["x-ratelimit-limit-requests"] == "30"
    assert first.headers["x-ratelimit-remaining-requests"] == "29"
    assert first.headers["x-ratelimit-reset-requests"].endswith("s")
    assert int(first.headers["x-ratelimit-limit-tokens"]) > 0
    drain(live_server, key)
    limited = post(live_server, key)
    assert limited.status_code == 429
    assert limited.json()["error"] == {
        "message": limited.json()["error"]["message"],
        "type": "requests",
        "param": None,
        "code": "rate_limit_exceeded",
    }
    assert 0 < int(limited.headers["retry-after"]) <= 2
    assert limited.headers["x-ratelimit-remaining-requests"] == "0"
    # Another workspace has its own limits.
    assert post(live_server, other_api_client.raw_key).status_code == 404

    # The official client retries a 429 after its retry-after; here every retry finds the limit
    # taken again (drained just before it is sent), so it raises RateLimitError at the end.
    attempts = []

    def before_each(request: httpx.Request) -> None:
        attempts.append(request)
        drain(live_server, key)

    client = openai_client(live_server, key).with_options(
        max_retries=2, http_client=httpx.Client(event_hooks={"request": [before_each]})
    )
    with pytest.raises(openai.RateLimitError) as raised:
        client.chat.completions.create(**BODY)
    assert len(attempts) == 3  # the request and its two retries
    assert raised.value.code == "rate_limit_exceeded"
    assert raised.value.response.headers["x-ratelimit-limit-requests"] == "30"
    # Left alone, its retry after retry-after gets through (to the router's 404).
    drain(live_server, key)
    with pytest.raises(openai.NotFoundError):
        openai_client(live_server, key).with_options(max_retries=1).chat.completions.create(**BODY)


def test_an_operators_override_and_concurrent_requests_never_pass_the_limit(
    live_server, api_client, workspace
):
    RateLimit.objects.create(workspace=workspace, requests_per_minute=5)
    statuses = []

    def one() -> None:
        statuses.append(post(live_server, api_client.raw_key).status_code)

    threads = [threading.Thread(target=one) for _ in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(statuses) == [404] * 5 + [429] * 15  # five admitted, at once or not


def test_tokens_per_minute_count_the_prompt_and_max_tokens(live_server, api_client, settings):
    settings.VERI_RATE_LIMIT_TOKENS_PER_MINUTE = 1000
    big = BODY | {"max_tokens": 600}
    assert post(live_server, api_client.raw_key, big).status_code == 404
    limited = post(live_server, api_client.raw_key, big)
    assert limited.status_code == 429 and limited.json()["error"]["type"] == "tokens"
    assert int(limited.headers["x-ratelimit-remaining-tokens"]) < 600
    small = post(live_server, api_client.raw_key, BODY | {"max_tokens": 10})
    assert small.status_code == 404  # what is left still takes a small request


def test_an_operator_sets_a_workspaces_limits_in_the_admin(api_client, workspace):
    from django.contrib.auth.models import User
    from django.test import Client

    User.objects.create_superuser("op", "op@example.com", "pw")
    admin = Client()
    admin.login(username="op", password="pw")
    added = admin.post(
        "/admin/serving/ratelimit/add/",
        {"workspace": workspace.pk, "requests_per_minute": 3, "tokens_per_minute": ""},
    )
    assert added.status_code == 302, added.content.decode()[:2000]
    answer = api_client.post("/v1/chat/completions", BODY, format="json")
    assert answer.status_code == 404
    assert answer["x-ratelimit-limit-requests"] == "3"
    assert answer["x-ratelimit-remaining-requests"] == "2"
    assert answer["x-ratelimit-limit-tokens"] == "1000000"  # the setting's: no override


SQLITE_ADMITS = """
from django.test.utils import override_settings
from serving.services import limits
from veri import services
from veri.errors import TooManyRequests

workspace, _ = services.create_workspace(name="embedded")
with override_settings(VERI_RATE_LIMIT_REQUESTS_PER_MINUTE=2):
    for _ in range(2):
        limits.admit(workspace=workspace, tokens=10)
    try:
        limits.admit(workspace=workspace, tokens=10)
    except TooManyRequests as refused:
        print("refused after", refused.headers["retry-after-ms"], "ms")
"""


@pytest.mark.django_db(transaction=False)
def test_the_embedded_defaults_sqlite_admits_and_refuses_too(tmp_path):
    """`make demo`'s database is SQLite, which has no GREATEST/LEAST: the limits' one statement
    must run there as on PostgreSQL (it answered every inference request with a 500)."""
    env = {
        **os.environ,
        "DATABASE_URL": f"sqlite:///{tmp_path / 'db.sqlite3'}",
        "VERI_STORE": f"file://{tmp_path / 'store'}",
    }
    manage = [sys.executable, str(REPO / "manage.py")]
    subprocess.run([*manage, "migrate", "-v0"], env=env, check=True, cwd=REPO)
    ran = subprocess.run(
        [*manage, "shell", "-c", SQLITE_ADMITS], env=env, capture_output=True, text=True, cwd=REPO
    )
    assert ran.returncode == 0, ran.stderr
    assert "refused after" in ran.stdout, ran.stdout
