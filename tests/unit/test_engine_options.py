"""Engine options and lifetime, from probing: what is refused, what a full queue means, what close() frees."""

from __future__ import annotations

import asyncio

import pytest
import torch

import specstruct as ss
from specstruct.config import KVMemory
from specstruct.testing import perturbed, tiny_model, tiny_tokenizer


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


def test_generate_many_never_overloads_its_own_engine(tok):
    """40 prompts through max_batch_size 8 / max_queue 4 failed with OverloadedError 29-35 times of 40: the
    workers submitted before the loop admitted any. A request headed for a free slot no longer counts as queued."""
    target = tiny_model(tok)
    with ss.SpecStruct(target, tok, batch_config={"max_batch_size": 8, "max_queue": 4, "timeout_ms": 0}) as e:
        out = e.generate_many([f"Say {i}" for i in range(40)], max_new_tokens=4, progress=False,
                              return_exceptions=True)
    assert not [x for x in out if isinstance(x, Exception)]
    with ss.SpecStruct(target, tok, batch_config={"max_queue": 0}) as e:  # "no queue beyond free slots"
        assert e.run("x", max_new_tokens=2).text is not None


def test_options_that_would_be_silently_ignored_are_refused(tok):
    with pytest.raises(ValueError):
        KVMemory(active_bytes=0)  # meant "no limit"; None says that
    with pytest.raises(ValueError):
        ss.SpecConfig(initial_candidates=0)  # never grew: speculation silently off
    with pytest.raises(ValueError):
        ss.EngineConfig(device="gpu")
    with ss.SpecStruct(tiny_model(tok), tok, engine_config=ss.EngineConfig(prefix_cache_bytes=0)) as e:
        assert e.run("x", config=ss.SpecConfig(max_new_tokens=2)).stats.new_tokens <= 2  # defaults are fine
        for per_call in ({"prefix_cache_bytes": 5}, {"kv_memory": {"active_bytes": 1}}):
            with pytest.raises(ss.InvalidParameterError, match=r"engine_config=EngineConfig\("):
                e.run("x", config=per_call)
        assert e.run("x", timeout=float("inf"), max_new_tokens=2).text is not None  # was OverflowError


def test_a_kv_directory_that_cannot_hold_files_is_refused_when_the_engine_is_built(tok, tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("x")
    with pytest.raises(ss.InvalidParameterError, match="kv_memory.directory"):
        ss.SpecStruct(tiny_model(tok), tok, engine_config={"kv_memory": {"directory": str(afile)}})


def test_close_removes_the_engines_spill_files(tok, tmp_path):
    built = ss.EngineConfig(prefix_cache_bytes=1, kv_memory={"directory": str(tmp_path)})
    e = ss.SpecStruct(tiny_model(tok), tok, config=ss.SpecConfig(max_new_tokens=4), engine_config=built)
    e.run("a prompt long enough to be cached " * 4)
    e.run("a prompt long enough to be cached " * 4)
    assert list(tmp_path.rglob("*.safetensors"))  # the prefix went to the disk tier
    e.close()
    assert not list(tmp_path.rglob("*.safetensors"))


def test_a_bfloat16_target_with_the_default_int8_draft_runs(tok):
    """Every request failed with 'expected scalar type Float but found BFloat16' in the int8 draft."""
    target = tiny_model(tok, dtype=torch.bfloat16)
    with ss.SpecStruct(target, tok, draft_model=perturbed(target)) as e:
        assert asyncio.run(e.arun("Say", max_new_tokens=3)).text is not None


@pytest.mark.parametrize("draft_rows", [472, 400])
def test_a_draft_that_differs_only_in_padding_rows_is_used_and_stays_lossless(tok, draft_rows):
    """Qwen2.5-7B (152,064 rows) with Qwen2.5-0.5B (151,936): same tokenizer, different padding. The draft's output
    rows are made the target's (408 here); greedy output equals target-only."""
    target = tiny_model(tok)
    draft = perturbed(target)
    draft.resize_token_embeddings(draft_rows, mean_resizing=False)
    prompt = "The flag is on. Answer with JSON."
    schema = {"type": "object", "properties": {"on": {"type": "boolean"}, "note": {"type": "string", "maxLength": 8}},
              "required": ["on", "note"]}
    with ss.SpecStruct(target, tok, config=ss.SpecConfig(enable_speculative=False, max_new_tokens=40)) as plain:
        want = plain.run(prompt, schema).token_ids
    with ss.SpecStruct(target, tok, draft_model=draft, config=ss.SpecConfig(max_new_tokens=40)) as e:
        got = e.run(prompt, schema)
    assert got.token_ids == want and got.stats.drafted > 0
    assert draft.get_output_embeddings().weight.shape[0] == draft_rows  # the user's draft is left as it was


def test_a_per_call_specconfig_sets_only_its_own_keys_and_engine_keys_are_refused_everywhere():
    """`config=SpecConfig(temperature=0)` sets temperature only (not every other key back to SpecConfig's
    defaults), as the same keys in a dict do; an EngineConfig key is refused, in a call's config or as a keyword,
    with the EngineConfig that sets it."""
    from specstruct.testing import scripted_engine

    engine = scripted_engine("hello there, friend", max_new_tokens=3, enable_speculative=False)
    for config in ({"temperature": 0}, ss.SpecConfig(temperature=0)):
        result = engine.run("x", config=config)
        assert len(result.token_ids) == 3 and result.stats.drafted == 0
    for call in (lambda: list(engine.stream("x", config={"dtype": "bfloat16"})),
                 lambda: list(engine.stream("x", config={"prefix_cache_bytes": 0}))):
        with pytest.raises(ss.InvalidParameterError, match=r"engine_config=EngineConfig\((dtype|prefix_cache_bytes)="):
            call()
    with pytest.raises(ValueError, match=r"engine_config=EngineConfig\(dtype=\.\.\.\)"):
        ss.SpecConfig(dtype="bfloat16")
    with pytest.raises(TypeError, match=r"EngineConfig\(dtype=\.\.\.\)"):  # not a keyword of any call
        list(engine.stream("x", dtype="bfloat16"))


def test_queue_time_ends_at_admission_not_after_the_prefill(monkeypatch):
    from specstruct.testing import scripted_engine, slow_steps

    engine = scripted_engine('{"a": 1}', max_new_tokens=10)
    slow_steps(monkeypatch, 0.3)
    stats = engine.run("x").stats
    assert stats.queue_s < 0.25 < stats.elapsed_s  # alone: no wait, however long its first pass


def test_seeds_beyond_32_bits_are_not_folded_onto_small_ones(tok):
    """torch's CPU generator keeps 32 bits of a seed: 0, 2**32, 2**63 and -2**63 sampled the same tokens."""
    from specstruct.spec.row import generator_seed

    assert generator_seed(7) == 7 and generator_seed(2**32 - 1) == 2**32 - 1  # seeded outputs stay as they were
    seeds = [0, 2**32, 2**63, -1, 5 + 2**40]  # (-2**63 is 2**63 to torch: the same 64 bits)
    assert len({generator_seed(s) for s in seeds}) == len(seeds)
    engine = ss.SpecStruct(tiny_model(tok, hidden=16, layers=1), tok, config=ss.SpecConfig(max_new_tokens=8))
    outs = {tuple(engine.run("x", temperature=1.0, seed=s).token_ids) for s in seeds}
    assert len(outs) > 1


def test_a_per_call_config_merges_caps_per_mode_and_an_explicit_none_clears():
    engine_config = ss.SpecConfig(max_candidates={"json": 4, "code": 4, "text": 1}, seed=5)
    call = engine_config.for_call(ss.SpecConfig(max_candidates={"json": 16}, seed=None))
    assert call.max_candidates["json"] == 16 and call.max_candidates["code"] == 4 and call.max_candidates["text"] == 1
    assert call.seed is None  # SpecConfig(seed=None): an unseeded call, as before per-call merging
    assert engine_config.for_call({"max_candidates": {"text": 2}}).max_candidates["json"] == 4
    assert engine_config.for_call({"seed": None}).seed == 5  # in a dict (or a keyword) None means "not given"
    back = engine_config.for_call(ss.SpecConfig(max_candidates={"json": 8}))  # a mode set to its default, on purpose
    assert back.max_candidates["json"] == 8 and back.max_candidates["code"] == 4
