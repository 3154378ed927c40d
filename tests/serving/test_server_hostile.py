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
    # unsalted: nothing of the tenants' prompt, only what every unsalted prompt shares (the chat template's start)
    chat(http, messages=[{"role": "user", "content": "xylophone tunes"}])
    template_only = cached(chat(http, messages=[{"role": "user", "content": "quartz crystals"}]))
    assert cached(chat(http, messages=messages)) == template_only


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


def refused(resp, param: str, *named: str):
    """A 400 about `param` whose message names each of `named` (the limit and its value); a small body."""
    assert resp.status_code == 400, resp.text[:2000]
    error = resp.json()["error"]
    assert error["param"] == param, error
    for word in named:
        assert word in error["message"], error["message"]
    assert len(resp.content) < 4096
    return error


def tool(name: str, description: str = "") -> dict:
    return {"type": "function", "function": {"name": name, "description": description,
                                             "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}}}}


def test_too_many_stop_strings(http):
    refused(chat(http, stop=[f"s{i}" for i in range(17)]), "stop", "17", "16", "max_stop_sequences")
    assert chat(http, stop=[f"s{i}" for i in range(16)]).status_code == 200


def test_too_long_stop_strings(http):
    refused(chat(http, stop=["x" * 3000, "y" * 3000]), "stop", "6000", "4096", "max_stop_chars")


def test_too_many_tools(http):
    error = refused(chat(http, tools=[tool(f"t{i}") for i in range(1500)]), "tools", "1500", "128", "max_tools")
    assert "start:" not in error["message"]  # no grammar echoed


def test_too_large_tools(http):
    tools = [tool(f"t{i}", "d" * 30_000) for i in range(9)]
    refused(chat(http, tools=tools), "tools", "262144", "max_tools_bytes")


@pytest.mark.parametrize("field,param", [
    ({"structured_outputs": {"regex": "a" * 300_000}}, "structured_outputs.regex"),
    ({"guided_grammar": "start: " + '"a" ' * 80_000}, "guided_grammar"),
    ({"structured_outputs": {"choice": ["c" * 1000] * 300}}, "structured_outputs.choice"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": {
        "type": "object", "description": "d" * 300_000}}}}, "response_format.json_schema.schema"),
])
def test_too_large_constraint(http, field, param):
    refused(chat(http, **field), param, "262144", "max_constraint_bytes")


def test_completions_are_limited_too(http):
    body = {"model": MODEL, "prompt": "hi", "max_tokens": 2, "stop": [f"s{i}" for i in range(20)]}
    refused(http.post("/completions", json=body), "stop", "max_stop_sequences")


@pytest.mark.parametrize("body", [
    {"response_format": {"type": "x" * 1_000_000}},  # echoed in "type ... is not supported"
    {"model": "m" * 1_000_000},                      # echoed in "the model ... does not exist"
    {"structured_outputs": {"regex": "(" * 200_000}},
])
def test_error_bodies_stay_small(http, body):
    resp = http.post("/chat/completions", json={"model": MODEL, "messages": LONG, "max_tokens": 2, **body})
    assert 400 <= resp.status_code < 500, resp.text[:500]
    assert len(resp.content) < 4096


def test_tool_grammar_is_built_off_the_event_loop(http, monkeypatch):
    """While one request's tools are prepared, the server keeps answering others."""
    import threading
    import time

    from specstruct.serving.openai import translate

    real, started = translate.tool_core.tool_grammar, threading.Event()

    def slow(*args, **kwargs):
        started.set()
        time.sleep(2)
        return real(*args, **kwargs)

    monkeypatch.setattr(translate.tool_core, "tool_grammar", slow)
    result = {}
    worker = threading.Thread(target=lambda: result.setdefault("r", chat(http, tools=[tool("a")], max_tokens=4)))
    worker.start()
    assert started.wait(30)
    t0 = time.monotonic()
    assert http.get("/models").status_code == 200
    assert time.monotonic() - t0 < 1.0  # not queued behind the 2 s grammar build
    worker.join(60)
    assert result["r"].status_code == 200, result["r"].text


@pytest.fixture(scope="module")
def small_heads():
    """A server whose header limits are small, so that a few hundred KB prove the rule."""
    limits = ServerLimits(max_header_bytes=8192, max_header_field_bytes=2048)
    with running(create_app(tiny_engine(), served_model_name=MODEL, api_key=KEY, limits=limits)) as base:
        yield base


def raw(base: str, head: bytes, timeout: float = 10) -> tuple[bytes, float]:
    """Send `head` (a request head, sent whole whatever the server does) on a new connection; (the reply, seconds
    until it came)."""
    import socket
    import threading
    import time
    from urllib.parse import urlsplit

    url = urlsplit(base)
    sock = socket.create_connection((url.hostname, url.port), timeout=timeout)

    def send():
        try:
            sock.sendall(head)
        except OSError:  # the server closed the connection: it has answered
            pass

    start = time.monotonic()
    threading.Thread(target=send, daemon=True).start()
    reply = b""
    try:
        while chunk := sock.recv(65536):
            reply += chunk
    except OSError:
        pass
    finally:
        sock.close()
    return reply, time.monotonic() - start


def head(*headers: str, path: str = "/v1/models") -> bytes:
    return (f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n" + "".join(h + "\r\n" for h in headers) + "\r\n").encode()


@pytest.mark.parametrize("headers", [
    ["X-Flood: " + "a" * 400_000],                          # one huge header
    [f"X-Many-{i}: " + "b" * 1000 for i in range(400)],     # many small ones
    ["Authorization: Bearer " + "k" * 400_000],             # before the key is checked
])
def test_oversized_headers_get_431_unread(small_heads, headers):
    reply, seconds = raw(small_heads, head(*headers))
    assert reply.startswith(b"HTTP/1.1 431 "), reply[:300]
    assert b"8192" in reply and b"--max-header-bytes" in reply
    assert seconds < 5


def test_a_client_that_sends_its_whole_head_before_reading_still_reads_its_431(small_heads):
    """Most clients read only once the request is sent: the server drops the rest of an oversized head unread
    (a lingering close) instead of resetting the connection, which would discard the 431 before it is read."""
    import socket
    import time
    from urllib.parse import urlsplit

    url = urlsplit(small_heads)
    for _ in range(3):
        with socket.create_connection((url.hostname, url.port), timeout=10) as sock:
            start = time.monotonic()
            sock.sendall(head("X-Flood: " + "f" * 4_000_000))  # far past the socket buffers
            reply = b""
            while chunk := sock.recv(65536):
                reply += chunk
        assert reply.startswith(b"HTTP/1.1 431 "), reply[:300]
        assert time.monotonic() - start < 5


def test_one_oversized_header_gets_431(small_heads):
    """Under the total limit, one header past the per-header limit: a 431 naming it, before the API key."""
    reply, _ = raw(small_heads, head("X-Big: " + "c" * 3000))
    assert reply.startswith(b"HTTP/1.1 431 "), reply[:300]
    assert b"x-big" in reply and b"2048" in reply and b"--max-header-field-bytes" in reply
    with httpx.Client(base_url=small_heads, headers={"Authorization": f"Bearer {KEY}"}) as client:
        assert client.get("/models", headers={"X-Fine": "d" * 1500}).status_code == 200


def test_health_answers_during_a_header_flood(small_heads):
    import threading
    import time

    done = threading.Event()

    def flood():
        while not done.is_set():
            raw(small_heads, head("X-Flood: " + "e" * 2_000_000))

    threads = [threading.Thread(target=flood, daemon=True) for _ in range(2)]
    for t in threads:
        t.start()
    try:
        with httpx.Client() as client:
            for _ in range(10):
                t0 = time.monotonic()
                assert client.get(small_heads.removesuffix("/v1") + "/health").status_code == 200
                assert time.monotonic() - t0 < 0.5
    finally:
        done.set()
        for t in threads:
            t.join(10)


HUGE = "@huge@"  # written into the body as 5000 digits (Python itself reads at most 4300)


@pytest.mark.parametrize("field", [
    {"max_tokens": HUGE}, {"seed": HUGE}, {"an_unknown_field": HUGE}, {"an_unknown_field": [HUGE]},
    {"response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": {
        "type": "integer", "maximum": HUGE}}}},
])
def test_integer_too_long_to_read_is_a_400(http, field):
    import json

    body = json.dumps({"model": MODEL, "messages": LONG, "max_tokens": 2, **field}).replace('"@huge@"', "9" * 5000)
    resp = http.post("/chat/completions", content=body, headers={"Content-Type": "application/json"})
    assert resp.status_code == 400, resp.text[:500]
    error = resp.json()["error"]
    assert "5000 digits" in error["message"] and error["code"] == "invalid_json", error
    assert len(resp.content) < 4096


@pytest.mark.parametrize("text,words", [
    ('"temperature": NaN', ["NaN", "not a number"]), ('"top_p": Infinity', ["Infinity", "not a number"]),
    ('"seed": -1', ["seed", "greater than or equal to 0"]),
])
def test_numbers_json_or_the_field_does_not_allow(http, text, words):
    body = '{"model": "%s", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, %s}' % (MODEL, text)
    resp = http.post("/chat/completions", content=body, headers={"Content-Type": "application/json"})
    assert resp.status_code == 400, resp.text[:500]
    for word in words:
        assert word in resp.json()["error"]["message"], resp.json()


@pytest.mark.parametrize("part", ["parameters", "grammar"])
def test_a_tool_call_compile_past_the_time_limit_is_a_400_at_it(http, monkeypatch, part):
    """A request's tools compile under the compile limits as every constraint: their parameter schemas, then the
    tool-call grammar. Past `time_s` the request ends at the limit with a 400 naming it, and the next one goes on."""
    import time

    from specstruct.constraints import limits as L
    from specstruct.constraints.llguidance import grammar, json_schema

    module, name = (json_schema, "_grammar") if part == "parameters" else (grammar, "build_matcher")
    real = getattr(module, name)

    def slow(*args, **kwargs):
        time.sleep(30)
        return real(*args, **kwargs)

    import uuid

    fresh = f"x_{uuid.uuid4().hex}"  # parameters never compiled before, in this process or the on-disk cache
    tools = [{"type": "function", "function": {"name": f"slow_{part}", "description": "", "parameters": {
        "type": "object", "properties": {fresh: {"type": "integer"}}}}}]
    if part == "grammar":
        assert chat(http, tools=tools, tool_choice="required").status_code == 200  # the parameters, prepared
        tools = [{**tools[0], "function": {**tools[0]["function"], "name": f"another_{fresh}"}}]  # the same
        # parameters (prepared), another grammar (not compiled yet)
    monkeypatch.setattr(L, "_LIMITS", L.limits())
    L.set_limits(time_s=1.0)
    monkeypatch.setattr(module, name, slow)
    start = time.monotonic()
    resp = chat(http, tools=tools, tool_choice="required", max_tokens=4)
    assert time.monotonic() - start < 2.5
    refused(resp, "tools", "limit time_s=1.0", "SPECSTRUCT_COMPILE_TIME_S")
    monkeypatch.undo()
    assert chat(http, tools=tools, tool_choice="required", max_tokens=4).status_code == 200
