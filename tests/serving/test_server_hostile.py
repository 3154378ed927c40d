"""Requests from tenants and clients that probe the server: another tenant's prefix cache (cache_salt), oversized
stop lists, tool lists and grammars, and error bodies that would echo megabytes back. Each gets a clear 4xx naming the
limit and its value, never a 500 or a hang."""

from __future__ import annotations

import httpx
import pytest
from server_fixtures import KEY, MODEL, running, tiny_engine

from specstruct.serving.openai import ServerLimits, create_app

LONG = [{"role": "user", "content": "tell me about the weather in the mountains " * 12}]


@pytest.fixture(scope="module")
def http():
    app = create_app(tiny_engine(), served_model_name=MODEL, api_key=KEY, limits=ServerLimits())
    with running(app) as base, httpx.Client(base_url=base, headers={"Authorization": f"Bearer {KEY}"},
                                            timeout=60) as client:
        yield client


def chat(http, **body):
    return http.post("/chat/completions", json={"model": MODEL, "messages": LONG, "max_tokens": 2, **body})


def cached(resp) -> int:
    assert resp.status_code == 200, resp.text
    return resp.json()["usage"]["prompt_tokens_details"]["cached_tokens"]


def test_cache_salt_keeps_tenants_apart(http):
    """A second tenant's identical prompt must not report (or be served from) the first tenant's cached prefix."""
    messages = [{"role": "user", "content": "the salted prompt about rivers and lakes " * 12}]
    assert cached(chat(http, messages=messages, cache_salt="tenant-a")) == 0
    assert cached(chat(http, messages=messages, cache_salt="tenant-a")) > 0  # same tenant: a hit
    assert cached(chat(http, messages=messages, cache_salt="tenant-b")) == 0  # another tenant: nothing shared
    assert cached(chat(http, messages=messages)) == 0  # unsalted: nothing shared either


def test_cache_salt_on_completions(http):
    body = {"model": MODEL, "prompt": "a completion prompt about the sea " * 12, "max_tokens": 2}
    first = http.post("/completions", json={**body, "cache_salt": "x"})
    again = http.post("/completions", json={**body, "cache_salt": "x"})
    other = http.post("/completions", json={**body, "cache_salt": "y"})
    assert cached(first) == 0 and cached(again) > 0 and cached(other) == 0


@pytest.mark.parametrize("salt", ["", 7, "s" * 5000])
def test_bad_cache_salt_is_a_400(http, salt):
    resp = chat(http, cache_salt=salt)
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["param"] == "cache_salt"
