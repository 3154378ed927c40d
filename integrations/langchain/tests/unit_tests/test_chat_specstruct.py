"""ChatSpecStruct end to end on the tiny engine: invoke, stream, async, batch, callbacks, metadata, caching."""

from __future__ import annotations

import asyncio

import pytest
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import AIMessage, AIMessageChunk, HumanMessage, SystemMessage

from langchain_specstruct import ChatSpecStruct, _engines

PROMPT = "Extract the person from this text: Grace Hopper, 85, invented the compiler."


class TokenRecorder(BaseCallbackHandler):
    def __init__(self) -> None:
        self.tokens: list[str] = []
        self.starts = 0
        self.ends = 0

    def on_chat_model_start(self, *args, **kwargs) -> None:
        self.starts += 1

    def on_llm_new_token(self, token: str, **kwargs) -> None:
        self.tokens.append(token)

    def on_llm_end(self, *args, **kwargs) -> None:
        self.ends += 1


def test_invoke_returns_text_usage_and_speculative_stats(chat):
    msg = chat.invoke(PROMPT)
    assert isinstance(msg, AIMessage) and isinstance(msg.content, str) and msg.content
    usage = msg.usage_metadata
    assert usage["input_tokens"] > 0 and 0 < usage["output_tokens"] <= 24
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
    meta = msg.response_metadata
    assert meta["model_provider"] == "specstruct" and meta["model_name"] == "specstruct-tiny"
    assert meta["finish_reason"] in ("stop", "length")
    spec = meta["speculative"]
    assert spec["target_forwards"] >= 1 and 0.0 <= spec["acceptance_rate"] <= 1.0
    assert spec["tokens_per_forward"] > 0


def test_stream_matches_invoke_and_marks_the_last_chunk(chat):
    full_text = chat.invoke(PROMPT).content  # greedy: streaming must produce the same text
    chunks = list(chat.stream(PROMPT))
    assert all(isinstance(c, AIMessageChunk) for c in chunks)
    assert chunks[-1].chunk_position == "last"
    assert [c for c in chunks if c.usage_metadata] == [chunks[-1]]  # usage reported once
    merged = chunks[0]
    for c in chunks[1:]:
        merged = merged + c
    assert merged.content == full_text
    assert merged.response_metadata["model_provider"] == "specstruct"


def test_streaming_flag_routes_invoke_through_stream_with_callbacks(engine):
    rec = TokenRecorder()
    # speculation off: one token per step, so several chunks whatever the drafts accept on a warm engine
    model = ChatSpecStruct(engine=engine, max_tokens=24, streaming=True, enable_speculative=False)
    msg = model.invoke(PROMPT, config={"callbacks": [rec]})
    assert len(rec.tokens) >= 2 and "".join(rec.tokens) == msg.content
    assert rec.starts == 1 and rec.ends == 1


def test_conversation_with_system_and_repeated_roles(chat):
    messages = [SystemMessage("Be brief."), SystemMessage("Answer in JSON."), HumanMessage("hi"),
                HumanMessage("hello"), AIMessage("hey"), AIMessage("there"), HumanMessage("how are you")]
    assert isinstance(chat.invoke(messages), AIMessage)


def test_batch_runs_every_prompt(chat):
    out = chat.batch(["one", "two", "three"])
    assert len(out) == 3 and all(isinstance(m, AIMessage) and m.usage_metadata for m in out)


def test_max_tokens_and_stop_are_honoured(engine):
    short = ChatSpecStruct(engine=engine, max_tokens=3).invoke(PROMPT)
    assert short.usage_metadata["output_tokens"] <= 3 and short.response_metadata["finish_reason"] == "length"
    full = ChatSpecStruct(engine=engine, max_tokens=24).invoke(PROMPT).content
    if len(full) > 4:
        stop = full[2:4]
        cut = ChatSpecStruct(engine=engine, max_tokens=24).invoke(PROMPT, stop=[stop]).content
        assert stop not in cut and full.startswith(cut)


@pytest.mark.asyncio
async def test_async_calls_do_not_block_the_event_loop(chat):
    ticks = 0
    stop = asyncio.Event()

    async def ticker():
        nonlocal ticks
        while not stop.is_set():
            ticks += 1
            await asyncio.sleep(0.001)

    task = asyncio.create_task(ticker())
    msg = await chat.ainvoke(PROMPT)
    streamed = [c async for c in chat.astream(PROMPT)]
    stop.set()
    await task
    assert isinstance(msg, AIMessage) and msg.content
    assert streamed[-1].chunk_position == "last"
    assert "".join(c.content for c in streamed) == msg.content
    assert ticks > 5  # the loop kept running while the model decoded in a worker thread


@pytest.mark.asyncio
async def test_abatch_and_early_astream_exit(chat):
    out = await chat.abatch(["one", "two"])
    assert len(out) == 2
    async for _ in chat.astream(PROMPT):
        break  # leaving early must release the engine for the next call
    assert (await chat.ainvoke("again")).content


def test_construction_is_lazy_and_engines_are_shared(monkeypatch, engine):
    import specstruct as ss

    loads = []

    def fake_from_pretrained(model, draft=None, engine_config=None):
        loads.append((model, draft, engine_config.device, engine_config.dtype))
        return engine

    monkeypatch.setattr(ss.SpecStruct, "from_pretrained", staticmethod(fake_from_pretrained))
    monkeypatch.setattr(_engines, "_ENGINES", {})
    models = [ChatSpecStruct(model="some/model", draft_model="some/draft", temperature=0) for _ in range(20)]
    assert loads == []  # nothing loads at construction
    assert models[0].invoke("hi").content and models[5].invoke("hi").content
    assert loads == [("some/model", "some/draft", "auto", "float32")]  # one load, shared
    ChatSpecStruct(model="some/model", draft_model="some/draft", enable_speculative=False).invoke("hi")
    assert loads[-1] == ("some/model", None, "auto", "float32")  # no draft loaded when speculation is off


def test_engine_may_be_passed_as_model(engine):
    model = ChatSpecStruct(model=engine)
    assert model.engine is engine and model.model == "specstruct-tiny"
    assert model._get_ls_params()["ls_model_name"] == "specstruct-tiny"


def test_speculative_keys_reach_the_engine_config(engine, monkeypatch):
    seen = {}
    original = engine.run

    def spy(prompt, output_type=None, **kwargs):
        seen.update(kwargs)
        return original(prompt, output_type, **kwargs)

    monkeypatch.setattr(engine, "run", spy)
    ChatSpecStruct(engine=engine, max_tokens=8, initial_candidates=5, adaptive_threshold=0.5,
                   enable_speculative=False).invoke("hi", temperature=0.0)
    cfg = seen["config"]
    assert (cfg.initial_candidates, cfg.adaptive_threshold, cfg.enable_speculative) == (5, 0.5, False)
    assert seen["max_new_tokens"] == 8 and seen["temperature"] == 0.0


def test_per_call_model_override_loads_that_model(monkeypatch, engine):
    import specstruct as ss

    loads = []

    def fake_from_pretrained(model, draft=None, engine_config=None):
        loads.append((model, draft))
        return engine

    monkeypatch.setattr(ss.SpecStruct, "from_pretrained", staticmethod(fake_from_pretrained))
    monkeypatch.setattr(_engines, "_ENGINES", {})
    base = ChatSpecStruct(model="base/model", draft_model="base/draft", max_tokens=4)
    msg = base.invoke("hi", model="other/model")
    assert loads == [("other/model", None)]  # the base model's draft is not paired with another target
    assert msg.response_metadata["model_name"] == "other/model"
    assert base._get_ls_params(model="other/model")["ls_model_name"] == "other/model"


def test_max_tokens_aliases_and_unknown_parameters_are_not_silently_dropped():
    """Found by probing: max_new_tokens (specstruct's own name) and max_completion_tokens (OpenAI's) were ignored
    without a word, and so was model_kwargs; ChatOpenAI honours the alias and warns about unknown keys."""
    import warnings

    from specstruct.testing import scripted_engine

    engine = scripted_engine("Hello there friend, this is long.")
    assert ChatSpecStruct(engine=engine).invoke("x", max_new_tokens=2).usage_metadata["output_tokens"] == 2
    for alias in ("max_new_tokens", "max_completion_tokens"):
        assert ChatSpecStruct(engine=engine, **{alias: 2}).invoke("x").usage_metadata["output_tokens"] == 2
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ChatSpecStruct(engine=engine, model_kwargs={"max_tokens": 2})
        ChatSpecStruct(engine=engine, temperature=0.1, tags=["a"])  # known keys: no warning
    assert [str(w.message) for w in caught if "ignores" in str(w.message)] == [
        w for w in [str(c.message) for c in caught] if "model_kwargs" in w]
    assert len([w for w in caught if "ignores" in str(w.message)]) == 1
