"""Every error path of the server answers with an OpenAI error object and the right status (never a 500 for bad
input); a client that disconnects mid-stream cancels its request; the queue limit answers 429 + Retry-After."""

from __future__ import annotations

import asyncio

import json
import threading
import time

import httpx
import openai
import pytest
from server_fixtures import KEY, MODEL, running, tiny_engine

from specstruct.serving.openai import ServerLimits, create_app

HI = [{"role": "user", "content": "hi"}]
LIMITS = ServerLimits(max_body_bytes=20_000, max_tokens_cap=300, max_prompt_tokens=400, max_queued_requests=2,
                      retry_after_s=3)


class SpyEngine:
    """The tiny engine, recording how each stream ended: run to the end, or closed early (cancelled).

    While `held` is set, every stream stops after its first chunk until it is cleared: requests stay in flight for
    as long as a test needs, however fast the machine generates."""

    def __init__(self, engine):
        self.engine, self.ended, self.held = engine, [], threading.Event()

    def __getattr__(self, name):
        return getattr(self.engine, name)

    async def astream(self, *args, **kwargs):
        chunks = 0
        try:
            async for chunk in self.engine.astream(*args, **kwargs):
                chunks += 1
                yield chunk
                while self.held.is_set():
                    await asyncio.sleep(0.01)
            self.ended.append(("finished", chunks))
        except (GeneratorExit, asyncio.CancelledError):
            self.ended.append(("cancelled", chunks))
            raise


@pytest.fixture(scope="module")
def served():
    app = create_app(SpyEngine(tiny_engine()), served_model_name=MODEL, api_key=KEY, limits=LIMITS)
    with running(app) as base:
        yield app.state.specstruct, base


@pytest.fixture(scope="module")
def http(served):
    with httpx.Client(base_url=served[1], headers={"Authorization": f"Bearer {KEY}"}, timeout=60) as c:
        yield c


def post(http, body, **kw):
    return http.post("/chat/completions", json={"model": MODEL, "messages": HI, "max_tokens": 4, **body}, **kw)


def expect(resp, status, param=None, code=None):
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    if param is not None:
        assert err["param"] == param, err
    if code is not None:
        assert err["code"] == code, err
    return err


def test_auth(served, http):
    base = served[1]
    expect(httpx.post(base + "/chat/completions", json={"model": MODEL, "messages": HI}), 401, code="invalid_api_key")
    expect(httpx.get(base + "/models", headers={"Authorization": "Bearer wrong"}), 401)
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=base, api_key="wrong", max_retries=0).models.list()
    assert httpx.get(base.removesuffix("/v1") + "/health").json() == {"status": "ok"}
    metrics = http.get(base.removesuffix("/v1") + "/metrics")
    assert metrics.status_code == 200 and "specstruct_requests_total" in metrics.text


def test_malformed_bodies(http):
    expect(http.post("/chat/completions", content=b"{not json", headers={"Content-Type": "application/json"}),
           400, code="invalid_json")
    expect(http.post("/chat/completions", json=[1, 2]), 400)
    expect(http.post("/chat/completions", json={"model": MODEL}), 400, param="messages")
    expect(post(http, {"temperature": 9}), 400, param="temperature")
    expect(post(http, {"seed": 2**70, "temperature": 1}), 400, param="seed")  # was a 500 from the engine's own check
    expect(post(http, {"messages": [{"role": "wizard", "content": "x"}]}), 400)
    expect(post(http, {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}),
           400, param="messages[0].content")


def test_unknown_model_and_unhonourable_fields(http):
    expect(post(http, {"model": "gpt-4o"}), 404, param="model", code="model_not_found")
    expect(post(http, {"n": 2}), 400, param="n")
    expect(post(http, {"logprobs": True}), 400, param="logprobs")
    expect(post(http, {"max_tokens": 301}), 400, param="max_tokens")
    expect(post(http, {"response_format": {"type": "xml"}}), 400, param="response_format.type")
    assert post(http, {"n": 1, "logprobs": False, "user": "u", "metadata": {}, "parallel_tool_calls": False,
                       "stream_options": None, "service_tier": "auto", "store": False}).status_code == 200


def test_constraints_that_cannot_be_guaranteed(http):
    schema = {"type": "object", "properties": {"a": {"type": "string", "not": {"pattern": "^x"}}}}
    err = expect(post(http, {"response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}}),
                 400, param="response_format.json_schema.schema", code="unsupported_constraint")
    assert "not" in err["message"]
    deep = json.loads('{"type": "array", "items": ' * 200 + "{}" + "}" * 200)  # was a RecursionError: a 500
    err = expect(post(http, {"response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": deep}}}),
                 400, param="response_format.json_schema.schema", code="unsupported_constraint")
    assert "max_schema_depth" in err["message"]
    expect(post(http, {"structured_outputs": {"regex": "[0-9"}}), 400, param="structured_outputs.regex")
    expect(post(http, {"structured_outputs": {"grammar": "start: nope"}}), 400, param="structured_outputs.grammar")
    expect(post(http, {"structured_outputs": {"regex": "a", "choice": ["b"]}}), 400, param="structured_outputs")
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    expect(post(http, {"tools": tools, "tool_choice": {"type": "function", "function": {"name": "g"}}}), 400,
           param="tool_choice")
    bad = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
        "a": {"type": "wat"}}}}}]
    err = expect(post(http, {"tools": bad, "tool_choice": "required"}), 400, param="tools", code="unsupported_constraint")
    assert "'f'" in err["message"] and "Lark" not in err["message"]  # names the tool, not the internal grammar
    expect(post(http, {"messages": [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "1", "type": "function", "function": {"name": "f", "arguments": "{oops"}}]}]}), 400,
        param="messages[0].tool_calls[0].function.arguments")


def test_routes_answer_like_openai(served, http):
    client = openai.OpenAI(base_url=served[1], api_key=KEY, max_retries=0)
    assert client.models.retrieve(MODEL).id == MODEL
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4o")
    expect(http.post("/embeddings", json={"model": MODEL, "input": "x"}), 404, code="not_found")
    for prompt in ([1, 2, 3], [[1, 2]]):  # OpenAI takes token IDs; this server says it does not
        err = expect(http.post("/completions", json={"model": MODEL, "prompt": prompt}), 400, param="prompt")
        assert "token IDs" in err["message"]
    expect(http.post("/completions", json={"model": MODEL, "prompt": ["a", "b"]}), 400, param="prompt")
    err = expect(http.get("/chat/completions"), 405)
    assert "POST /v1/chat/completions" in err["message"]


def test_prompt_and_body_limits(http):
    expect(post(http, {"messages": [{"role": "user", "content": "word " * 600}]}), 400,
           code="context_length_exceeded")
    expect(post(http, {"messages": [{"role": "user", "content": "x" * 30_000}]}), 413)


def test_queue_limit_is_429_with_retry_after(served, http):
    server, _ = served
    body = {"model": MODEL, "messages": HI, "max_tokens": 250, "stream": True,
            "structured_outputs": {"regex": "[ab]{250}"}}  # no early EOS
    server.engine.held.set()  # both streams stay in flight until the 429 has been seen, on any machine
    try:
        with http.stream("POST", "/chat/completions", json=body) as first, \
                http.stream("POST", "/chat/completions", json=body) as second:
            lines = first.iter_lines(), second.iter_lines()  # kept: a dropped iterator closes its response
            assert all(next(each).startswith("data: ") for each in lines)
            resp = post(http, {})
            expect(resp, 429, code="overloaded")
            assert resp.headers["Retry-After"] == "3"
            server.engine.held.clear()
    finally:
        server.engine.held.clear()
    wait_idle(server)
    assert post(http, {}).status_code == 200


def wait_idle(server, seconds=20):
    deadline = time.monotonic() + seconds
    while server.admission.count and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.admission.count == 0


def test_client_disconnect_cancels_the_generation(served, http):
    server, _ = served
    body = {"model": MODEL, "messages": HI, "max_tokens": 300, "stream": True,
            "structured_outputs": {"regex": "[ab]{300}"}}
    server.engine.ended.clear()
    with http.stream("POST", "/chat/completions", json=body) as resp:
        lines = (line for line in resp.iter_lines() if line)
        assert next(lines).startswith("data: ")
        assert '"content":"' in next(lines)  # generation under way
    wait_idle(server)
    deadline = time.monotonic() + 20  # the worker notices the cancellation at its next step
    while not server.engine.ended and time.monotonic() < deadline:
        time.sleep(0.05)
    (how, chunks), = server.engine.ended
    assert how == "cancelled" and chunks < 300
    r = post(http, {"max_tokens": 2})
    assert r.status_code == 200 and json.loads(r.text)["usage"]["completion_tokens"] == 2


def raw(http, text: bytes):
    return http.post("/chat/completions", content=text, headers={"Content-Type": "application/json"})


def test_wrongly_shaped_fields_are_400s_naming_the_field_never_500s(http):
    """Found by probing: each of these was a 500 (an AttributeError or RecursionError inside the server)."""
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    expect(post(http, {"messages": HI + [{"role": "assistant", "tool_calls": [{"id": "x", "function": "f"}]}]}),
           400, param="messages[1].tool_calls[0].function")
    expect(post(http, {"tools": tools, "tool_choice": {"type": "function", "function": "f"}}), 400,
           param="tool_choice.function")
    expect(post(http, {"response_format": {"type": "json_schema", "json_schema": "abc"}}), 400,
           param="response_format.json_schema")
    expect(raw(http, b'{"model":"' + MODEL.encode() + b'","messages":[{"role":"user","content":"hi"}],"x":'
               + b"[" * 1500 + b"]" * 1500 + b"}"), 400, code="invalid_json")
    for text in (b'"a\\ud800b"',):  # a lone surrogate: the engine's InvalidPromptError, now a 400
        expect(raw(http, b'{"model":"%s","max_tokens":4,"messages":[{"role":"user","content":%s}]}'
                   % (MODEL.encode(), text)), 400, param="messages")
    expect(raw(http, b'{"model":"%s","max_tokens":4,"structured_outputs":{"regex":"\\ud800"},"messages":'
               b'[{"role":"user","content":"hi"}]}' % MODEL.encode()), 400, code="unsupported_constraint")
    expect(http.post("/completions", content=b'{"model":"%s","max_tokens":4,"prompt":"a\\udc00"}' % MODEL.encode(),
                     headers={"Content-Type": "application/json"}), 400, param="prompt")


def test_smaller_deviations_from_openai(http):
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    err = expect(post(http, {"tools": [], "tool_choice": "required"}), 400, param="tool_choice")
    assert "required" in err["message"] and "names" not in err["message"]
    expect(http.post("/completions", json={"model": MODEL, "prompt": []}), 400, param="prompt")
    expect(post(http, {"messages": [{"role": "user", "content": [{"type": "text", "text": None}]}]}), 400,
           param="messages[0].content[0].text")
    expect(post(http, {"stop": 5}), 400, param="stop")  # not "stop.str"
    expect(post(http, {"tool_choice": "any", "tools": tools}), 400, param="tool_choice")
    expect(post(http, {"functions": [{"name": "f"}]}), 400, param="functions")
    expect(post(http, {"modalities": ["text", "audio"]}), 400, param="modalities")
    expect(post(http, {"stream_options": {"include_usage": True}}), 400, param="stream_options")
    for name in ("", "a b", 'x"y', "n" * 65):
        expect(post(http, {"tools": [{"type": "function", "function": {"name": name}}]}), 400,
               param="tools[0].function.name")


def test_parameters_that_would_change_the_output_are_refused_or_honoured_never_ignored(http):
    """vLLM clients send its sampling extras; this server speaks vLLM's structured_outputs, so they are refused by
    name (or, for the older guided_* fields, honoured), never silently ignored. Numbers as strings are 400s."""
    for name, value in (("top_k", 1), ("min_p", 0.5), ("repetition_penalty", 2.0), ("min_tokens", 8),
                        ("ignore_eos", True), ("stop_token_ids", [5]), ("skip_special_tokens", False)):
        expect(post(http, {name: value}), 400, param=name)
    assert post(http, {"top_k": -1, "repetition_penalty": 1.0, "min_p": 0}).status_code == 200  # their no-ops
    r = post(http, {"guided_choice": ["yes", "no"], "max_tokens": 10})
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] in ("yes", "no")
    expect(http.post("/completions", json={"model": MODEL, "prompt": "a", "logprobs": 0}), 400, param="logprobs")
    for name, value in (("temperature", "0.5"), ("max_tokens", "5"), ("seed", True), ("top_p", "1")):
        expect(post(http, {name: value}), 400, param=name)
    schema = {"type": "json_schema", "json_schema": {"name": "n", "schema": {"type": "object"}}}
    expect(post(http, {"response_format": schema, "structured_outputs": {"choice": ["a"]}}), 400,
           param="structured_outputs")  # one would silently override the other
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    other = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}
    expect(post(http, {"tools": [tool, other]}), 400, param="tools")
    expect(post(http, {"tools": [tool], "guided_choice": ["a"]}), 400, param="guided_choice")
    for name, value in (("continue_final_message", True), ("add_generation_prompt", False),
                        ("chat_template_kwargs", {"enable_thinking": False})):  # vLLM's prompt rendering
        expect(post(http, {name: value}), 400, param=name)
    refusal = [*HI, {"role": "assistant", "content": [{"type": "refusal", "refusal": "I can't."}]},
               {"role": "user", "content": "ok"}]
    assert post(http, {"messages": refusal}).status_code == 200  # the SDK's own type for a replayed refusal


def test_without_max_tokens_a_long_prompt_gets_what_the_context_window_leaves():
    """OpenAI and vLLM default max_tokens to the rest of the window; the server's 512 made a fitting prompt a 400
    that named a parameter the client never sent."""
    engine = tiny_engine()
    sentence = "Ada wrote the first program. "
    n = len(engine.prompt_ids([{"role": "user", "content": sentence * 100}], max_new_tokens=1))
    filler = sentence * (100 * 3900 // n)  # about 3,900 of the 4,096-token window
    with running(create_app(engine, served_model_name=MODEL)) as base, httpx.Client(base_url=base, timeout=120) as c:
        body = {"model": MODEL, "messages": [{"role": "user", "content": filler}],
                "structured_outputs": {"regex": "[ab]{1,3}"}}
        assert c.post("/chat/completions", json=body).status_code == 200
        err = expect(c.post("/chat/completions", json={**body, "max_tokens": 500}), 400)
        assert "max_tokens is 500" in err["message"] and "max_new_tokens" not in err["message"]


def test_a_request_whose_kv_can_never_fit_is_a_400():
    import specstruct as ss
    from specstruct.testing import tiny_model, tiny_tokenizer

    tok = tiny_tokenizer()
    engine = ss.SpecStruct(tiny_model(tok, seed=0), tok, model_name=MODEL,
                           config=ss.SpecConfig(max_new_tokens=40),
                           engine_config={"kv_memory": {"active_bytes": 500_000}})
    app = create_app(engine, served_model_name=MODEL, api_key=KEY, limits=ServerLimits(max_tokens_cap=4000))
    with running(app) as base, httpx.Client(base_url=base, headers={"Authorization": f"Bearer {KEY}"}) as c:
        expect(post(c, {"max_tokens": 2000}), 400, param="messages", code="context_length_exceeded")


def test_a_closed_engine_is_unhealthy_and_its_requests_are_503s():
    """Found by probing Ray Serve: /health said ok and requests got a 500 (advice for library callers) while a
    replica's engine was closed; a load balancer needs 503 to route elsewhere."""
    import specstruct as ss
    from specstruct.testing import tiny_model, tiny_tokenizer

    tok = tiny_tokenizer()
    engine = ss.SpecStruct(tiny_model(tok, seed=0), tok, model_name=MODEL)  # its own: the shared one must stay open
    app = create_app(engine, served_model_name=MODEL, api_key=KEY)
    with running(app) as base, httpx.Client(base_url=base, headers={"Authorization": f"Bearer {KEY}"}) as c:
        root = base.removesuffix("/v1")
        assert httpx.get(root + "/health").status_code == 200
        engine.close()
        health = httpx.get(root + "/health")
        assert health.status_code == 503 and "closed" in health.json()["error"]
        expect(post(c, {}), 503, code="engine_unavailable")


def test_usage_reports_cached_prompt_tokens_and_stop_applies_to_constrained_replies():
    """Found by probing: usage had no prompt_tokens_details.cached_tokens although the prefix cache served the
    prompt; `stop` was silently dropped for response_format / structured_outputs / tools."""
    engine = tiny_engine()
    app = create_app(engine, served_model_name=MODEL, api_key=KEY, limits=ServerLimits(max_tokens_cap=300))
    long = [{"role": "user", "content": "cached " * 300}]
    with running(app) as base, httpx.Client(base_url=base, headers={"Authorization": f"Bearer {KEY}"}) as c:
        first = post(c, {"messages": long, "max_tokens": 2}).json()["usage"]
        second = post(c, {"messages": long, "max_tokens": 2}).json()["usage"]
        cached = [u["prompt_tokens_details"]["cached_tokens"] for u in (first, second)]
        assert cached[0] < first["prompt_tokens"] // 2 < cached[1] < second["prompt_tokens"]  # (a shared template
        # prefix may be cached from earlier requests; the repeated prompt's body only the second time)
        plain = post(c, {"max_tokens": 30, "structured_outputs": {"regex": "[a-c]{20}"}}).json()["choices"][0]
        stop = plain["message"]["content"][5:7]
        cut = post(c, {"max_tokens": 30, "structured_outputs": {"regex": "[a-c]{20}"}, "stop": [stop]}).json()
        choice = cut["choices"][0]
        assert choice["finish_reason"] == "stop" and stop not in choice["message"]["content"]
        assert plain["message"]["content"].startswith(choice["message"]["content"])


def test_every_streamed_request_observes_time_to_first_token(http, served):
    """Found by probing: a streamed tool call cut by max_tokens sends its deltas only at the end, and was never
    counted in specstruct_time_to_first_token_seconds."""
    base = served[1]

    def ttft_count() -> float:
        text = http.get(base.removesuffix("/v1") + "/metrics").text
        return float(next(line.split()[-1] for line in text.splitlines()
                          if line.startswith("specstruct_time_to_first_token_seconds_count")))

    before = ttft_count()
    tools = [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"n": {"type": "string", "minLength": 300}}, "required": ["n"]}}}]
    for _ in range(2):
        with http.stream("POST", "/chat/completions", json={"model": MODEL, "messages": HI, "max_tokens": 30,
                                                            "tools": tools, "tool_choice": "required",
                                                            "stream": True}) as r:
            assert r.status_code == 200 and "[DONE]" in r.read().decode()
    assert ttft_count() == before + 2
