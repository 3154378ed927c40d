"""SpecStructLLM (text completion) on the tiny engine: invoke, batch, stream, callbacks, async, constraints."""

from __future__ import annotations

import asyncio

import pytest
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.outputs import GenerationChunk

from langchain_specstruct import SpecStructLLM

PROMPT = "The quick brown fox"


class Recorder(BaseCallbackHandler):
    def __init__(self) -> None:
        self.tokens: list[str] = []
        self.ends = 0

    def on_llm_new_token(self, token: str, **kwargs) -> None:
        self.tokens.append(token)

    def on_llm_end(self, *args, **kwargs) -> None:
        self.ends += 1


@pytest.fixture
def llm(engine):
    return SpecStructLLM(engine=engine, max_tokens=16)


def test_invoke_returns_the_completion_with_generation_info(llm):
    result = llm.generate([PROMPT])
    (gen,) = result.generations[0]
    assert isinstance(gen.text, str) and gen.text
    info = gen.generation_info
    assert info["finish_reason"] in ("stop", "length") and 0 < info["usage"]["output_tokens"] <= 16
    assert info["speculative"]["target_forwards"] >= 1
    assert result.llm_output["model_name"] == "specstruct-tiny"
    assert llm.invoke(PROMPT) == gen.text  # greedy: the same text again


def test_batch_keeps_prompt_order(llm):
    prompts = ["one", "two", "three"]
    assert llm.batch(prompts) == [llm.invoke(p) for p in prompts]


def test_stream_yields_chunks_and_calls_on_llm_new_token(engine):
    # speculation off: one token per step, so a stream has several chunks whatever the drafts (with speculation a
    # warm engine may accept the whole output in one step, and one chunk would prove nothing about streaming)
    llm = SpecStructLLM(engine=engine, max_tokens=16, enable_speculative=False)
    rec = Recorder()
    chunks = list(llm.stream(PROMPT, config={"callbacks": [rec]}))
    assert "".join(chunks) == llm.invoke(PROMPT)
    assert len(rec.tokens) >= 2 and "".join(rec.tokens) == "".join(chunks) and rec.ends == 1


def test_direct_stream_last_chunk_carries_info(llm):
    chunks = list(llm._stream(PROMPT))
    assert all(isinstance(c, GenerationChunk) for c in chunks)
    assert chunks[-1].generation_info["usage"]["output_tokens"] > 0
    assert all(c.generation_info is None for c in chunks[:-1])


def test_streaming_flag_feeds_callbacks_during_invoke(engine):
    rec = Recorder()
    text = SpecStructLLM(engine=engine, max_tokens=12, streaming=True, enable_speculative=False).invoke(
        PROMPT, config={"callbacks": [rec]})  # one token per step (see above)
    assert "".join(rec.tokens) == text and len(rec.tokens) >= 2


def test_output_type_constrains_the_completion(llm):
    import specstruct as ss

    assert llm.invoke("Is the sky blue?", output_type=ss.Choice(["yes", "no"])) in ("yes", "no")
    digits = llm.invoke("A year:", output_type=ss.Regex(r"[0-9]{4}"))
    assert len(digits) == 4 and digits.isdigit()


@pytest.mark.asyncio
async def test_async_invoke_batch_and_stream(llm):
    text = await llm.ainvoke(PROMPT)
    assert text == llm.invoke(PROMPT)
    assert await llm.abatch(["one", "two"]) == [llm.invoke("one"), llm.invoke("two")]
    rec = Recorder()
    chunks = [c async for c in llm.astream(PROMPT, config={"callbacks": [rec]})]
    assert "".join(chunks) == text and "".join(rec.tokens) == text
    await asyncio.sleep(0)
