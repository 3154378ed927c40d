"""batch / abatch / ainvoke / astream go through the engine's scheduler concurrently (no lock per call): the
calls overlap in its queue, every output equals the one-at-a-time output, and (with the batched decoder) the
batch takes fewer target passes than the calls one at a time."""

from __future__ import annotations

import asyncio
import threading
from typing import Literal

import pytest
from pydantic import BaseModel

from langchain_specstruct import ChatSpecStruct, SpecStructLLM

LIMIT = 120  # seconds: a deadlock fails instead of hanging CI
PROMPTS = [f"Request {i}: switch the {room} light {state}." for i, (room, state) in
           enumerate([("kitchen", "on"), ("hall", "off")] * 4)]


class Light(BaseModel):
    on: bool
    room: Literal["kitchen", "hall"]


def bounded(fn):
    out: dict = {}
    t = threading.Thread(target=lambda: out.update(value=fn()), daemon=True)
    t.start()
    t.join(LIMIT)
    assert not t.is_alive(), "did not finish in time: deadlock?"
    return out["value"]


@pytest.fixture
def engine():
    """A fresh engine (its scheduler's counters are this test's alone), watched for overlapping requests."""
    import specstruct as ss
    from specstruct.testing import perturbed, tiny_model, tiny_tokenizer

    tok = tiny_tokenizer()
    model = tiny_model(tok, seed=0)
    e = ss.SpecStruct(model, tok, draft_model=perturbed(model), config=ss.SpecConfig(max_new_tokens=24),
                      batch_config={"max_batch_size": 8, "timeout_ms": 50})
    sched, submit = e.scheduler, e.scheduler.submit
    e.in_queue = []  # requests waiting or running, seen at each submission

    def watched(*args, **kwargs):
        req = submit(*args, **kwargs)
        e.in_queue.append(sched.waiting + sched.active)
        return req

    sched.submit = watched
    yield e
    e.close()


def test_abatch_of_structured_calls_runs_concurrently(engine):
    structured = ChatSpecStruct(engine=engine).with_structured_output(Light)
    passes = engine.scheduler.passes
    alone = [structured.invoke(p) for p in PROMPTS]
    alone_passes = engine.scheduler.passes - passes
    engine.in_queue.clear()
    passes = engine.scheduler.passes
    together = bounded(lambda: asyncio.run(structured.abatch(PROMPTS)))
    assert together == alone and all(isinstance(x, Light) for x in together)
    assert max(engine.in_queue) >= 2  # the calls were queued together, not one after another
    assert engine.scheduler.passes - passes < alone_passes  # together they shared passes


def test_batch_ainvoke_and_astream_share_the_engine(engine):
    chat = ChatSpecStruct(engine=engine, max_tokens=16)
    llm = SpecStructLLM(engine=engine, max_tokens=16)
    alone = [chat.invoke(p).content for p in PROMPTS[:4]]
    engine.in_queue.clear()
    assert [m.content for m in bounded(lambda: chat.batch(PROMPTS[:4]))] == alone
    assert max(engine.in_queue) >= 2

    async def main():
        invoked = await asyncio.gather(*(chat.ainvoke(p) for p in PROMPTS[:4]))
        streamed = await asyncio.gather(*(_collect(chat.astream(p)) for p in PROMPTS[:4]))
        texts = await llm.abatch(PROMPTS[:4])
        return [m.content for m in invoked], streamed, texts

    invoked, streamed, texts = bounded(lambda: asyncio.run(main()))
    assert invoked == alone and streamed == alone
    assert texts == [llm.invoke(p) for p in PROMPTS[:4]] == bounded(lambda: llm.batch(PROMPTS[:4]))


async def _collect(stream) -> str:
    return "".join([chunk.content async for chunk in stream])
