"""Requests that end early, slowly or badly (found by probing): a finished request is read to the end however slowly;
cancelled requests hold no queue place; odd timeouts are refused by name; generate_many stops on the first error;
closing waits for the step under way."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

import specstruct as ss
from specstruct.testing import scripted_engine, slow_steps, tiny_model, tiny_tokenizer

JSON = '{"a": 1, "b": [true, false]}'


def test_a_finished_request_is_read_to_the_end_by_a_slow_reader():
    engine = scripted_engine(JSON, max_new_tokens=30)
    chunks = []
    for chunk in engine.stream("x", {"type": "object"}, timeout=0.5):
        chunks.append(chunk)
        if len(chunks) == 1:
            time.sleep(0.8)  # decoding ends meanwhile, well within the timeout
    assert chunks[-1].result.value == {"a": 1, "b": [True, False]}

    async def slow_async() -> dict:
        got = []
        async for chunk in engine.astream("x", {"type": "object"}, timeout=0.5):
            got.append(chunk)
            if len(got) == 1:
                await asyncio.sleep(0.8)
        return got[-1].result.value

    assert asyncio.run(slow_async()) == {"a": 1, "b": [True, False]}


@pytest.mark.parametrize("timeout", [float("nan"), -1, "1", True])
def test_odd_timeouts_are_refused_by_name(timeout):
    engine = scripted_engine(JSON, max_new_tokens=30)
    with pytest.raises(ss.InvalidParameterError, match="timeout="):
        engine.run("x", timeout=timeout)
    with pytest.raises(ss.InvalidParameterError, match="timeout="):
        list(engine.stream("x", timeout=timeout))
    with pytest.raises(ss.InvalidParameterError, match="timeout="):
        asyncio.run(engine.arun("x", timeout=timeout))


def warm_engine_with_slow_steps(monkeypatch, seconds: float, max_new_tokens: int, **batch_config):
    """A tiny engine, warmed up, whose every later step first sleeps `seconds` (a long prefill, a big model)."""
    tok = tiny_tokenizer()
    engine = ss.SpecStruct(tiny_model(tok, hidden=16, layers=1), tok,
                           config=ss.SpecConfig(max_new_tokens=max_new_tokens), batch_config=batch_config or None)
    engine.run("warm", max_new_tokens=1)
    slow_steps(monkeypatch, seconds)
    return engine


@pytest.mark.slow
def test_cancelled_requests_hold_no_queue_place(monkeypatch):
    engine = warm_engine_with_slow_steps(monkeypatch, 0.4, 8, max_batch_size=1, max_queue=1, timeout_ms=0)
    a = threading.Thread(target=engine.run, args=("A",))
    a.start()
    time.sleep(0.1)
    with pytest.raises(ss.RequestTimeoutError):
        engine.run("B", timeout=0.05)  # waits in the queue, gives up
    engine.scheduler.check_room()  # B's place is free again at once, not after the step under way
    a.join()
    engine.close()


def test_generate_many_starts_nothing_after_the_first_failure():
    engine = scripted_engine(JSON, max_new_tokens=30, max_retries=0)
    calls = []
    original = engine.generate

    def counting(prompt, *args, **kwargs):
        calls.append(prompt)
        if prompt == "bad":
            raise ValueError("bad prompt")
        time.sleep(0.05)
        return original(prompt, *args, **kwargs)

    engine.generate = counting
    with pytest.raises(ValueError, match="bad prompt"):
        engine.generate_many(["bad"] + ["ok"] * 60, progress=False)
    assert len(calls) < 30  # the workers running when it failed, not the whole list


@pytest.mark.slow
def test_close_waits_for_the_step_under_way(monkeypatch):
    """A step still inside torch at interpreter exit aborts the process; close() waits for it instead."""
    engine = warm_engine_with_slow_steps(monkeypatch, 2.5, 4)
    errors = []
    t = threading.Thread(target=lambda: errors.append(pytest.raises(ss.EngineClosedError, engine.run, "A")))
    t.start()
    time.sleep(0.3)
    engine.close()
    assert not engine.scheduler._thread.is_alive()
    assert engine.cache_info()["entries"] == 0  # the loop did not refill the closed prefix cache after close()
    t.join()


def test_a_request_cancelled_while_waiting_names_the_cancel(monkeypatch):
    engine = warm_engine_with_slow_steps(monkeypatch, 0.3, 4, max_batch_size=1, timeout_ms=0)
    a = threading.Thread(target=engine.run, args=("A",))
    a.start()
    time.sleep(0.1)
    req = engine.scheduler.submit(engine.prompt_ids("B"), engine.constraint(None).fork(), engine.config)
    req.cancel()  # still in the queue: it never gets a row
    with pytest.raises(ss.RequestCancelledError, match="cancelled before it wrote anything"):
        req.result()
    a.join()
    engine.close()
