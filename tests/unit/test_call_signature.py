"""One call signature: run, stream, arun and astream take the same keywords (generate, agenerate and
generate_many pass theirs on), and a keyword none of them knows is refused before anything runs."""

from __future__ import annotations

import asyncio
import inspect

import pytest

import specstruct as ss
from specstruct.testing import scripted_engine


def _keywords(fn):
    return [(n, p.default, p.annotation) for n, p in inspect.signature(fn).parameters.items()
            if p.kind is p.KEYWORD_ONLY]


def test_run_stream_arun_and_astream_share_one_signature():
    run = _keywords(ss.SpecStruct.run)
    assert [n for n, _, _ in run] == ["system", "tools", "tool_choice", "max_new_tokens", "temperature", "top_p",
                                      "seed", "stop", "cache_salt", "config", "timeout"]
    for other in (ss.SpecStruct.stream, ss.SpecStruct.arun, ss.SpecStruct.astream):
        assert _keywords(other) == run, other.__name__


def test_every_call_refuses_an_unknown_keyword_and_takes_a_known_one():
    engine = scripted_engine('"ok"')
    with pytest.raises(TypeError, match="use_prefix_caches"):
        engine.run("go", str, use_prefix_caches=False)
    with pytest.raises(TypeError, match="use_prefix_caches"):
        list(engine.stream("go", str, use_prefix_caches=False))
    with pytest.raises(TypeError, match="use_prefix_caches"):
        asyncio.run(engine.arun("go", str, use_prefix_caches=False))
    with pytest.raises(TypeError, match=r"generate_many\(\) got unexpected keyword arguments \['max_tokens'\]"):
        engine.generate_many(["a", "b"], str, max_tokens=3)
    config = ss.SpecConfig(use_prefix_cache=False)  # any per-call key goes through config=
    assert engine.run("go", str, config=config, max_new_tokens=8, stop="\n").text == engine.generate(
        "go", str, max_new_tokens=8)

    async def both():
        streamed = [c async for c in engine.astream("go", str, max_new_tokens=8, seed=1)]
        return streamed[-1].result.text, (await engine.arun("go", str, max_new_tokens=8)).text

    a, b = asyncio.run(both())
    assert a == b


def test_a_config_key_given_as_a_keyword_is_refused_with_the_call_that_passes_it():
    engine = scripted_engine('"ok"')
    hint = r"\['initial_candidates'\] are SpecConfig keys: pass config=\{'initial_candidates': \.\.\.\}"
    with pytest.raises(TypeError, match=hint):
        list(engine.stream("go", str, initial_candidates=4))
    with pytest.raises(TypeError, match=hint):
        asyncio.run(engine.astream("go", str, initial_candidates=4).__anext__())
    with pytest.raises(TypeError, match=hint):
        asyncio.run(engine.arun("go", str, initial_candidates=4))
    with pytest.raises(TypeError, match=hint):
        engine.generate_many(["a"], str, initial_candidates=4)
    assert engine.run("go", str, config={"initial_candidates": 4}).text == engine.run("go", str).text


def test_the_async_calls_still_read_as_async_to_introspection():
    assert inspect.iscoroutinefunction(ss.SpecStruct.arun) and inspect.isasyncgenfunction(ss.SpecStruct.astream)
    assert inspect.isgeneratorfunction(ss.SpecStruct.stream) and not inspect.isgeneratorfunction(ss.SpecStruct.run)


def test_the_old_name_of_the_speculator_still_reads_with_a_warning():
    engine = scripted_engine('"ok"')
    with pytest.warns(DeprecationWarning, match="SpecStruct.speculator"):
        assert engine.engine is engine.speculator
