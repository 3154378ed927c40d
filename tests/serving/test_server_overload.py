"""Engine-side overload and the engine's gauges (found by probing): a stream the engine cannot queue is a 429 before
its status line goes out (not a 200 with an error event); /metrics reads the scheduler's queue and running rows; a
client that leaves a stream is counted as 499, not 200."""

from __future__ import annotations

import time

import httpx
import pytest
from server_fixtures import MODEL, running
from test_server_errors import SpyEngine, expect, wait_idle

import specstruct as ss
from specstruct.serving.openai import create_app
from specstruct.testing import tiny_model, tiny_tokenizer

BODY = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 200, "stream": True,
        "structured_outputs": {"regex": "[ab]{200}"}}


@pytest.fixture(scope="module")
def one_slot():
    tok = tiny_tokenizer()
    engine = ss.SpecStruct(tiny_model(tok, hidden=16, layers=1), tok, model_name=MODEL,
                           batch_config={"max_batch_size": 1, "max_queue": 0, "timeout_ms": 0})
    app = create_app(SpyEngine(engine), served_model_name=MODEL)
    with running(app) as base, httpx.Client(base_url=base, timeout=60) as http:
        yield app.state.specstruct, http, base.removesuffix("/v1")
    engine.close()


def test_a_stream_the_engine_cannot_queue_is_a_429_and_the_gauges_show_it(one_slot):
    server, http, root = one_slot
    server.engine.held.set()  # the first stream keeps the only slot until the checks are done
    try:
        with http.stream("POST", "/chat/completions", json=BODY) as first:
            lines = first.iter_lines()
            assert next(lines).startswith("data: ")  # the role chunk, sent before the request reaches the engine
            scheduler, deadline = server.engine.scheduler, time.monotonic() + 20
            while scheduler.waiting + scheduler.active == 0 and time.monotonic() < deadline:
                time.sleep(0.01)
            resp = http.post("/chat/completions", json=BODY)
            expect(resp, 429, code="overloaded")
            assert resp.headers.get("Retry-After")
            metrics = http.get(root + "/metrics").text
            assert "specstruct_batch_rows 1.0" in metrics
        deadline = time.monotonic() + 20  # still held: the server sees the client leave, not the stream end
        while not server.engine.ended and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        server.engine.held.clear()
    wait_idle(server)
    deadline = time.monotonic() + 20  # the cancelled row leaves the batch at the loop's next step
    while server.engine.scheduler.active and time.monotonic() < deadline:
        time.sleep(0.01)
    metrics = http.get(root + "/metrics").text
    assert 'specstruct_requests_total{endpoint="chat",status="499"} 1.0' in metrics  # the stream left early
    assert "specstruct_batch_rows 0.0" in metrics and "specstruct_queue_length 0.0" in metrics


def test_a_timeout_tells_the_openai_client_not_to_retry():
    """The SDK retries 5xx twice by default: a request that ran past the server's timeout would run twice more."""
    from server_fixtures import tiny_engine

    from specstruct.serving.openai import ServerLimits

    app = create_app(tiny_engine(), served_model_name=MODEL, limits=ServerLimits(request_timeout_s=0.05))
    with running(app) as base, httpx.Client(base_url=base, timeout=60) as http:
        body = {**BODY, "stream": False, "max_tokens": 200}
        resp = http.post("/chat/completions", json=body)
        assert resp.status_code == 504 and resp.headers["x-should-retry"] == "false"


def test_a_request_cut_by_server_shutdown_gets_a_503_in_openais_shape(monkeypatch):
    """uvicorn cancels requests still running past its graceful timeout; the client got a plain-text 500."""
    import threading

    import uvicorn

    from specstruct.testing import slow_steps

    tok = tiny_tokenizer()
    engine = ss.SpecStruct(tiny_model(tok, hidden=16, layers=1), tok, model_name=MODEL)
    slow_steps(monkeypatch, 0.05)
    server = uvicorn.Server(uvicorn.Config(create_app(engine, served_model_name=MODEL), host="127.0.0.1", port=0,
                                           log_level="critical", timeout_graceful_shutdown=1))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.02)
    base = f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}/v1"
    got = []
    body = {**BODY, "stream": False, "max_tokens": 400, "structured_outputs": {"regex": "[ab]{400}"}}
    client = threading.Thread(target=lambda: got.append(httpx.post(base + "/chat/completions", json=body, timeout=60)))
    client.start()
    time.sleep(1.0)
    server.should_exit = True
    thread.join(30)
    client.join(30)
    engine.close()
    (resp,) = got
    assert resp.status_code == 503 and resp.json()["error"]["code"] == "shutting_down"


def test_a_stream_cut_by_server_shutdown_ends_with_an_error_the_openai_client_raises(monkeypatch):
    """uvicorn cancels streams still running past its graceful timeout: the connection closed mid-body, no error event
    and no [DONE], and the client saw a transport error (an incomplete chunked read) that does not say why.
    GracefulServer (what `specstruct serve` runs) ends them first: an error event naming the shutdown, then [DONE]."""
    import threading

    import openai
    import uvicorn

    from specstruct.serving.openai.graceful import GracefulServer
    from specstruct.testing import slow_steps

    tok = tiny_tokenizer()
    engine = ss.SpecStruct(tiny_model(tok, hidden=16, layers=1), tok, model_name=MODEL)
    slow_steps(monkeypatch, 0.05)
    server = GracefulServer(uvicorn.Config(create_app(engine, served_model_name=MODEL), host="127.0.0.1", port=0,
                                           log_level="critical", timeout_graceful_shutdown=1))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.02)
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}/v1",
                           api_key="none", max_retries=0)
    stream = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], stream=True,
                                            max_tokens=400, extra_body={"structured_outputs": {"regex": "[ab]{400}"}})
    text = []
    threading.Timer(0.8, lambda: setattr(server, "should_exit", True)).start()
    with pytest.raises(openai.APIError, match="shutting down"):
        for chunk in stream:
            text.append(chunk.choices[0].delta.content or "" if chunk.choices else "")
    thread.join(30)
    engine.close()
    assert not thread.is_alive() and 0 < len("".join(text)) < 400
