"""Many threads at once through one engine: every output valid, none lost, no deadlock, and each output (greedy)
token for token what the same request decodes alone."""

from __future__ import annotations

import json
import re
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from pydantic import BaseModel, Field

import specstruct as ss

THREADS = 50
LIMIT = 120  # seconds: a deadlock fails the test instead of hanging CI


class Person(BaseModel):
    name: str = Field(max_length=10)  # random weights ramble: bounded strings keep every output complete
    adult: bool


SCHEMA = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}, "big": {"type": "boolean"}},
          "required": ["city", "big"]}
DATE = ss.Regex(r"\d{4}-\d{2}-\d{2}")
MOOD = ss.Choice(["positive", "negative", "neutral"])

REQUESTS = [
    ("Extract: Ada Lovelace, 36.", Person, {}),
    ("Where? Paris, 3.", SCHEMA, {}),
    ("When was it?", DATE, {}),
    ("How does it feel?", MOOD, {}),
    ("Say something.", None, {"max_new_tokens": 12}),
]


def valid(output_type, value, text) -> bool:
    if output_type is Person:
        return isinstance(value, Person)
    if output_type is SCHEMA:
        return set(json.loads(text)) == {"city", "big"} and isinstance(value["big"], bool)
    if output_type is DATE:
        return re.fullmatch(r"\d{4}-\d{2}-\d{2}", text) is not None
    if output_type is MOOD:
        return value in MOOD.options
    return isinstance(value, str)


@pytest.fixture(scope="module")
def engine(tok, target, close_draft):
    e = ss.SpecStruct(target, tok, draft_model=close_draft, config=ss.SpecConfig(max_new_tokens=48),
                      batch_config={"max_batch_size": 8, "timeout_ms": 5, "max_queue": THREADS})
    yield e
    e.close()


def test_fifty_threads_of_mixed_requests(engine):
    jobs = [REQUESTS[i % len(REQUESTS)] for i in range(THREADS)]
    alone = {i: engine.run(p, t, **kw).token_ids for i, (p, t, kw) in enumerate(REQUESTS)}
    start = threading.Barrier(THREADS, timeout=LIMIT)

    def call(i: int):
        prompt, output_type, kw = jobs[i]
        start.wait()  # all at once
        how = i % 3
        if how == 0:
            return engine.run(prompt, output_type, timeout=LIMIT, **kw)
        if how == 1:
            chunks = list(engine.stream(prompt, output_type, timeout=LIMIT, **kw))
            assert "".join(c.text for c in chunks) == chunks[-1].result.text
            return chunks[-1].result
        import asyncio

        return asyncio.run(engine.arun(prompt, output_type, timeout=LIMIT, **kw))

    with ThreadPoolExecutor(THREADS) as pool:
        results = list(pool.map(call, range(THREADS), timeout=LIMIT))
    assert len(results) == THREADS
    for i, res in enumerate(results):
        prompt, output_type, _ = jobs[i]
        assert valid(output_type, res.value, res.text), (i, res.text)
        assert res.token_ids == alone[i % len(REQUESTS)], (i, res.text)
        assert res.stats.batch_rows >= 1.0 and res.stats.queue_s >= 0.0
    assert engine.scheduler.active == 0 and engine.scheduler.waiting == 0
    assert max(r.stats.batch_rows for r in results) > 1.0  # the batched decoder shares its passes


def test_validation_retries_are_new_requests_among_others(engine):
    from pydantic import field_validator

    seen = []

    class Picky(BaseModel):
        name: str = Field(max_length=10)
        adult: bool

        @field_validator("adult")
        @classmethod
        def once_wrong(cls, v):
            seen.append(v)
            if len(seen) == 1:
                raise ValueError("try again")
            return v

    with ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(engine.run, "Extract: Ada, 36.", Picky, timeout=LIMIT)]
        futures += [pool.submit(engine.run, p, t, timeout=LIMIT, **kw) for p, t, kw in REQUESTS[:3]]
        results = [f.result(timeout=LIMIT) for f in futures]
    assert len(results[0].attempts) == 1 and isinstance(results[0].value, Picky)
