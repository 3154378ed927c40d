"""The scheduler on tiny models: admission, overload, cancellation, failures in one row, streams as rows,
asyncio, generate_many, closing. Every test is bounded in time, so a deadlock fails instead of hanging CI."""

from __future__ import annotations

import asyncio
import gc
import threading
import time

import pytest
from pydantic import BaseModel, ValidationError

import specstruct as ss
from specstruct.engine.scheduler import DEFAULT_DECODER

LIMIT = 60  # seconds any one test may take before it counts as a hang
LONG = ss.Regex("[ab]{150}")  # a row that runs for a second or two (no EOS before 150 tokens)


class Flag(BaseModel):
    ok: bool


def bounded(fn, seconds: float = LIMIT):
    """Run fn in a thread; fail (instead of hanging) when it does not return in time."""
    out: dict = {}

    def target():
        try:
            out["value"] = fn()
        except BaseException as e:  # noqa: BLE001
            out["error"] = e

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"did not finish in {seconds} s: deadlock?"
    if "error" in out:
        raise out["error"]
    return out.get("value")


def until(cond, seconds: float = 20.0) -> None:
    end = time.monotonic() + seconds
    while not cond():
        assert time.monotonic() < end, "condition not reached in time"
        time.sleep(0.005)


class Recording(DEFAULT_DECODER):
    """The engine's row decoder, remembering how many tokens each row had when it left; `gate` pauses step()."""

    def __init__(self, engine, **kw):
        super().__init__(engine, **kw)
        self.removed: list[tuple[int, str]] = []
        self.gate = threading.Event()
        self.gate.set()
        self.delay = 0.0  # seconds added to every step (a slow model, without timing on the machine's speed)

    def remove(self, row):
        self.removed.append((len(row.token_ids), row.finish_reason))
        super().remove(row)

    def step(self):
        assert self.gate.wait(LIMIT)
        time.sleep(self.delay)
        return super().step()


@pytest.fixture()
def make(tok, target, close_draft):
    engines = []

    def build(**batch):
        e = ss.SpecStruct(target, tok, draft_model=close_draft, batch_config={"timeout_ms": 0, **batch},
                          decoder=Recording)
        e.constraint(LONG)  # compiled before any timeout starts
        engines.append(e)
        return e

    yield build
    for e in engines:
        e.close()


def test_batch_config_validates_its_keys(tok, target):
    assert ss.BatchConfig().model_dump() == {"max_batch_size": 8, "timeout_ms": 50.0, "fill_strategy": "sequential",
                                             "max_queue": 256}
    with pytest.raises(ValidationError):
        ss.BatchConfig(max_batch_size=8, timeout=5)
    with pytest.raises(ValidationError):
        ss.SpecStruct(target, tok, batch_config={"fill_strategy": "random"})
    with ss.SpecStruct(target, tok, batch_config={"max_batch_size": 2, "max_queue": 4}) as e:
        assert e.batch_config.max_batch_size == 2 and e.scheduler.config.max_queue == 4


def test_from_pretrained_takes_batch_config(tok, target, monkeypatch):
    import specstruct.runtime.gguf_model as gguf_model

    monkeypatch.setattr(gguf_model, "load_model", lambda *a, **k: (target, tok))
    with ss.SpecStruct.from_pretrained("tiny", batch_config={"max_batch_size": 3, "timeout_ms": 0}) as e:
        assert e.scheduler.config == ss.BatchConfig(max_batch_size=3, timeout_ms=0)
    with pytest.raises(ValidationError, match="max_batch"):
        ss.SpecStruct.from_pretrained("tiny", batch_config={"max_batch": 3})


def test_stats_carry_queue_time_and_batch_rows(make):
    e = make(timeout_ms=2000)
    res = bounded(lambda: e.run("Is the sky blue?", Flag))
    assert res.stats.queue_s < 1.0  # a lone request on an idle engine is not held for timeout_ms
    assert res.stats.batch_rows >= 1.0


def test_an_idle_engine_gathers_a_burst_then_starts(make, monkeypatch):
    """Requests arriving close together (each within the gather gap of the last) start in one batch, the first
    one waiting for the others up to timeout_ms; the burst ends at the first gap. (A wide gap here, so that a
    busy machine cannot stretch the test's own pause past it.)"""
    from specstruct.engine import scheduler

    monkeypatch.setattr(scheduler, "GATHER_GAP_S", 0.5)
    e = make(timeout_ms=4000)
    e.run("warm", Flag)  # the loop runs and is idle again
    added = []
    add = e.scheduler.decoder.add
    e.scheduler.decoder.add = lambda row: (added.append(e.scheduler.passes), add(row))
    first = e.scheduler.submit(e.prompt_ids("a"), e.constraint(Flag).fork(), e.config)
    time.sleep(0.05)
    second = e.scheduler.submit(e.prompt_ids("b"), e.constraint(Flag).fork(), e.config)
    rows = [first.result(), second.result()]
    assert added[0] == added[1]  # both admitted before the same pass: the first waited for the second
    assert rows[0].stats.queue_s < 3.0  # not the whole timeout_ms: the burst ended at the first gap


def test_overload_raises_at_once_and_the_queue_drains(make):
    e = make(max_batch_size=1, max_queue=2)
    dec = lambda: e.scheduler.decoder  # noqa: E731
    e.scheduler.submit(e.prompt_ids("x"), e.constraint(Flag).fork(), e.config).result()  # starts the loop
    dec().gate.clear()
    reqs = [e.scheduler.submit(e.prompt_ids("a"), e.constraint(Flag).fork(), e.config)]
    until(lambda: e.scheduler.active == 1 and e.scheduler.waiting == 0)
    reqs += [e.scheduler.submit(e.prompt_ids(p), e.constraint(Flag).fork(), e.config) for p in "bc"]
    t0 = time.monotonic()
    with pytest.raises(ss.OverloadedError, match="max_queue=2"):
        e.scheduler.submit(e.prompt_ids("d"), e.constraint(Flag).fork(), e.config)
    assert time.monotonic() - t0 < 1.0
    dec().gate.set()
    for r in reqs:
        assert r.result(time.monotonic() + LIMIT).finish_reason == "stop"


def test_timeout_cancels_and_frees_the_slot(make):
    e = make(max_batch_size=1)
    assert isinstance(bounded(lambda: e.generate("Is it?", Flag)), Flag)  # starts the loop
    e.scheduler.decoder.delay = 0.05  # >= 150 tokens in <= 9 per step: well over the 0.3 s timeout
    with pytest.raises(ss.RequestTimeoutError, match="cancelled"):
        bounded(lambda: e.run("go", LONG, max_new_tokens=200, timeout=0.3))
    until(lambda: e.scheduler.active == 0)
    assert e.scheduler.decoder.removed[-1][0] < 150  # left mid-decode, not at the end
    e.scheduler.decoder.delay = 0.0
    assert isinstance(bounded(lambda: e.generate("Is it?", Flag)), Flag)  # the slot is free again


def test_a_failing_request_fails_alone(make):
    e = make(max_batch_size=4)

    class Broken:  # a constraint that breaks mid-decode (a bug in a row's state)
        mode = "json"

        def __getattr__(self, name):
            raise RuntimeError("broken constraint")

    good = [e.scheduler.submit(e.prompt_ids(p), e.constraint(Flag).fork(), e.config) for p in ("a", "b")]
    bad = e.scheduler.submit(e.prompt_ids("c"), Broken(), e.config)
    more = e.scheduler.submit(e.prompt_ids("d"), e.constraint(Flag).fork(), e.config)
    with pytest.raises(RuntimeError, match="broken constraint"):
        bad.result(time.monotonic() + LIMIT)
    for r in good + [more]:
        assert r.result(time.monotonic() + LIMIT).finish_reason == "stop"
    with pytest.raises(ss.PromptTooLongError):  # before admission: raised in the caller, no slot taken
        e.run("word " * 5000, Flag)
    with pytest.raises(ss.ConstraintError):
        e.run("x", {"type": "object", "properties": {"a": {"type": "string", "pattern": "("}}})
    assert e.scheduler.active == 0 and e.scheduler.waiting == 0


def test_run_inside_a_stream_loop_does_not_deadlock(make):
    e = make()

    def body():
        texts = []
        for chunk in e.stream("Is the sky blue?", Flag):
            texts.append(e.run("Inner call?", Flag).value)
        return texts

    assert all(isinstance(v, Flag) for v in bounded(body))


def test_half_read_stream_does_not_block_others_and_abandoned_stream_is_cancelled(make):
    e = make(max_batch_size=2)
    stream = e.stream("go", LONG, max_new_tokens=200)
    next(stream)
    assert isinstance(bounded(lambda: e.generate("Is it?", Flag)), Flag)
    del stream
    gc.collect()
    until(lambda: e.scheduler.active == 0)
    assert any(n < 150 for n, _ in e.scheduler.decoder.removed)  # the stream's row left before it was done


def test_asyncio_calls_and_task_cancellation(make):
    e = make()
    alone = e.run("Is the sky blue?", Flag).token_ids

    async def main():
        runs = await asyncio.gather(*(e.arun("Is the sky blue?", Flag) for _ in range(4)))
        value = await e.agenerate("Is the sky blue?", Flag)
        chunks = [c async for c in e.astream("Is the sky blue?", Flag)]
        e.scheduler.decoder.delay = 0.05  # >= 150 tokens in <= 9 per step: far longer than the waits below
        task = asyncio.create_task(e.arun("go", LONG, max_new_tokens=200))
        while e.scheduler.active == 0:
            await asyncio.sleep(0.005)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        with pytest.raises(ss.RequestTimeoutError):
            await e.arun("go", LONG, max_new_tokens=200, timeout=0.3)
        e.scheduler.decoder.delay = 0.0
        return runs, value, chunks

    runs, value, chunks = bounded(lambda: asyncio.run(main()))
    assert all(r.token_ids == alone for r in runs) and isinstance(value, Flag)
    assert chunks[-1].result.token_ids == alone and "".join(c.text for c in chunks) == chunks[-1].result.text
    until(lambda: e.scheduler.active == 0)


def test_generate_many_keeps_input_order_and_returns_exceptions(make):
    e = make(max_batch_size=3)
    prompts = [f"Answer {i}: yes or no?" for i in range(7)]
    choice = ss.Choice(["yes", "no", "maybe"])
    alone = [e.generate(p, choice) for p in prompts]
    assert bounded(lambda: e.generate_many(prompts, choice, progress=False)) == alone
    mixed = prompts[:2] + ["word " * 5000] + prompts[2:4]
    out = bounded(lambda: e.generate_many(mixed, choice, return_exceptions=True))
    assert isinstance(out[2], ss.PromptTooLongError) and out[:2] + out[3:] == alone[:4]
    with pytest.raises(ss.PromptTooLongError):
        bounded(lambda: e.generate_many(mixed, choice, progress=False))


def test_close_fails_new_calls_and_stops_the_thread(tok, target):
    e = ss.SpecStruct(target, tok, batch_config={"timeout_ms": 0})
    e.generate("Is it?", Flag)
    thread = e.scheduler._thread
    e.close()
    thread.join(LIMIT)
    assert not thread.is_alive()
    with pytest.raises(ss.EngineClosedError):
        e.generate("Is it?", Flag)


def test_exit_never_waits_on_a_running_request(make):
    """What interpreter exit relies on: a daemon thread, close() registered with atexit, and close() returning
    promptly while a row is mid-decode (its caller then gets EngineClosedError, not a hang)."""
    e = make()
    stream = e.stream("go", ss.Regex("[ab]{1000}"), max_new_tokens=1100)  # still running when closed
    next(stream)
    assert e.scheduler._thread.daemon and e._finalizer.atexit
    t0 = time.monotonic()
    e.close()
    assert time.monotonic() - t0 < 5.0
    with pytest.raises(ss.EngineClosedError):
        bounded(lambda: list(stream))
