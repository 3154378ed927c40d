"""Cached prefill == cold prefill, bit for bit, on tiny random Qwen2 models over a real BPE tokenizer: logits and
KV for exact, shorter, longer and divergent prefix matches (target float32, draft float32 and int8); whole
generations through the API with a prefix from another output type, under a tiny budget, spilled to disk, across
threads and salts; spill / resume of a sequence; the budget check; the cache-friendly prompt layout."""

from __future__ import annotations

import threading

import pytest
import torch

import specstruct as ss
from specstruct.runtime.kv import KVLostWarning, KVStore, PrefixCache, SeqKV
from specstruct.runtime.kv.layers import span
from specstruct.runtime.kv.tiers import DiskTier, MemoryTier
from specstruct.config import SpecConfig, split_params
from specstruct.constraints.base import ConstraintSpec
from specstruct.constraints.compiler import compile_constraint
from specstruct.runtime.model_runtime import ModelRuntime, quantize_draft
from specstruct.spec.batch import BatchDecoder
from specstruct.spec.speculator import Speculator
from specstruct.errors import KVMemoryError
from specstruct.testing import OneSequence, draft_first

TEXT = ("Extract the person from this text: Grace Hopper, 85, invented the compiler. Answer with JSON. "
        "The quick brown fox jumps over the lazy dog. Ada Lovelace wrote the first program in 1843. "
        "SELECT name, age FROM people WHERE age > 30 ORDER BY name;")
PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 16},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 120}},
          "required": ["name", "age"], "additionalProperties": False}
SYSTEM = "You extract records for a pipeline. Copy names exactly. " * 3
PASSAGES = ["Grace Hopper, 85, invented the compiler.", "Ada Lovelace, 36, wrote the first program.",
            "Alan Turing, 41, broke codes."]


def _same_kv(a, b):
    return all(torch.equal(x, y) and torch.equal(p, q) for (x, p), (y, q) in zip(a, b))


def _free(tok, rt):
    return compile_constraint(ConstraintSpec("text", None), tok, vocab_size=rt.vocab_size,
                              eos_token_ids=[tok.eos_token_id])


def _prefill(spec, tok, ids, *, cached):
    """One request's prompt through the production path (Speculator.row -> BatchDecoder.add, which takes the
    longest cached prefix, then BatchDecoder.step until the prompt is read): (logits after the last prompt token,
    its KV of the prompt, prompt tokens taken from the cache). It then finishes, which offers its KV to the cache."""
    rt, outputs = spec.target, []
    forward = rt.forward

    def spy(segments, keep, masks=None):
        out = forward(segments, keep, masks)
        outputs.append(out[0][-1].clone())
        return out

    row = spec.row(ids, _free(tok, rt), SpecConfig(max_new_tokens=2, enable_speculative=False,
                                                   use_prefix_cache=cached))
    batch = BatchDecoder(spec)
    batch.add(row)
    rt.forward = spy
    try:
        while row.prefilling:
            batch.step()
        last = outputs[-1]  # the last prefill pass's final row: the logits after the last prompt token
        kv = [(k[..., : len(ids), :].clone(), v[..., : len(ids), :].clone()) for k, v in row.kv.views()]
        while len(batch):
            batch.step()
    finally:
        del rt.forward
    return last, kv, row.stats.cached_prompt_tokens


@pytest.mark.parametrize("numerics", ["target", "draft-float32", "draft-int8", "draft-int8-torchao"])
@pytest.mark.parametrize("seed_with", ["exact", "shorter", "longer", "divergent"])
def test_cached_prefill_equals_cold_prefill_bitwise(tok, target, close_draft, seed_with, numerics):
    """On the production path: a prompt whose prefix an earlier request left in the cache gives bit for bit the
    logits and KV of the same prompt read cold, whatever part of it was cached, under each numerics the cache
    serves (the float32 target; a draft model's weights as the target: float32, int8, torch.ao's int8)."""
    model = ({"target": target, "draft-float32": close_draft}.get(numerics)
             or quantize_draft(close_draft, torchao=numerics.endswith("torchao")))
    rt = ModelRuntime(model)
    spec = Speculator(rt, tok, [tok.eos_token_id], prefix_cache=PrefixCache([MemoryTier(1 << 26)]))
    ids = tok.encode(TEXT, add_special_tokens=False)
    assert len(ids) > 48  # more than one 32-token prefill chunk
    cold_logits, cold_kv, none = _prefill(spec, tok, ids, cached=False)
    assert none == 0 and spec.prefix_cache.info()["cached_tokens"] == 0  # use_prefix_cache=False caches nothing
    seed = {"exact": ids, "shorter": ids[:50], "longer": ids + ids[:20],
            "divergent": ids[:60] + tok.encode(" something else entirely", add_special_tokens=False)}[seed_with]
    _prefill(spec, tok, seed, cached=True)
    logits, kv, from_cache = _prefill(spec, tok, ids, cached=True)
    if not rt.reuses_prefixes:  # torch.ao's int8: a row's numerics depend on its neighbours, so no reuse at all
        assert from_cache == 0
    else:
        assert from_cache > 0
    assert torch.equal(logits, cold_logits)
    assert _same_kv(kv, cold_kv)


def _engine(tok, target, close_draft, **keys):
    built, call = split_params(keys)
    return ss.SpecStruct(target, tok, draft_model=close_draft, config=ss.SpecConfig(**call), engine_config=built)


def _runs(engine, passages, output_type=PERSON, **kw):
    return [engine.run(p, output_type, system=SYSTEM, max_new_tokens=40, **kw) for p in passages]


@pytest.fixture(scope="module")
def cold_outputs(tok, target, close_draft):
    eng = _engine(tok, target, close_draft, prefix_cache_bytes=0)
    return [r.token_ids for r in _runs(eng, PASSAGES)]


@pytest.mark.parametrize("draft_numerics", ["int8", "float32"])
def test_generations_with_the_cache_equal_generations_without(tok, target, close_draft, cold_outputs,
                                                               draft_numerics):
    eng = _engine(tok, target, close_draft, draft_numerics=draft_numerics)
    eng.run(PASSAGES[0], ss.Choice(["yes", "no"]), system=SYSTEM,
            max_new_tokens=4)  # another output type caches the system prompt first
    results = _runs(eng, PASSAGES)
    assert [r.token_ids for r in results] == cold_outputs
    assert all(r.stats.cached_prompt_tokens > 0 for r in results)
    info = eng.cache_info()
    assert info["hits"] >= len(PASSAGES) and 0 < info["hit_rate"] <= 1 and info["bytes"]["ram"] > 0


@pytest.mark.parametrize("draft_numerics", ["int8", "float32"])
def test_the_draft_model_reuses_cached_prefixes_too(tok, target, close_draft, cold_outputs, draft_numerics,
                                                    monkeypatch):
    """The draft reads only what the cache lacks of a prompt (before, it re-read every prompt whole while the
    target skipped the cached part); greedy outputs stay those of cold runs."""
    from specstruct.spec import batch

    started = []
    original = batch.DraftState.__init__

    def spy(self, runtime, layers=None, tokens=()):
        started.append(len(tokens))
        original(self, runtime, layers, tokens)

    monkeypatch.setattr(batch.DraftState, "__init__", spy)
    eng = _engine(tok, target, close_draft, draft_numerics=draft_numerics)
    draft_first(eng.speculator)
    assert [r.token_ids for r in _runs(eng, PASSAGES)] == cold_outputs
    assert started[0] == 0 and all(n > len(SYSTEM) // 8 for n in started[1:]), started
    cold = _engine(tok, target, close_draft, draft_numerics=draft_numerics, use_prefix_cache=False)
    draft_first(cold.speculator)
    started.clear()
    _runs(cold, PASSAGES[:2])
    assert started == [0, 0]  # use_prefix_cache=False: nothing reused, for the draft either


@pytest.mark.parametrize("disk", [0, 1 << 24])
def test_tiny_budget_evicts_or_spills_and_outputs_stay_the_same(tok, target, close_draft, cold_outputs, disk,
                                                                 tmp_path):
    eng = _engine(tok, target, close_draft, prefix_cache_bytes=60_000,
                  kv_memory=ss.config.KVMemory(disk_bytes=disk, directory=str(tmp_path)))
    results = _runs(eng, PASSAGES + PASSAGES[:1])
    assert [r.token_ids for r in results[:-1]] == cold_outputs and results[-1].token_ids == cold_outputs[0]
    info = eng.cache_info()
    assert info["bytes"]["ram"] <= 60_000
    assert (info["spills"] > 0 and info["restores"] > 0) if disk else info["evictions"] > 0
    eng.prefix_cache.close()


def test_concurrent_requests_sharing_one_prefix(tok, target, close_draft, cold_outputs):
    """A prefix hit inside a batch: one call caches the shared prefix, then concurrent calls are batched together
    (the scheduler admits them into one BatchDecoder) and each starts from the cached prefix."""
    eng = _engine(tok, target, close_draft)
    eng.run(PASSAGES[0], ss.Choice(["yes", "no"]), system=SYSTEM, max_new_tokens=4)
    got: dict[int, list[int]] = {}

    def call(i):
        got[i] = eng.run(PASSAGES[i], PERSON, system=SYSTEM, max_new_tokens=40).token_ids

    threads = [threading.Thread(target=call, args=(i,)) for i in range(len(PASSAGES))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [got[i] for i in range(len(PASSAGES))] == cold_outputs
    assert eng.cache_info()["hits"] >= len(PASSAGES)


def test_salted_prefixes_are_not_shared(tok, target, close_draft):
    eng = _engine(tok, target, close_draft)
    first = eng.run(PASSAGES[0], PERSON, system=SYSTEM, max_new_tokens=40, cache_salt="tenant-a")
    other = eng.run(PASSAGES[1], PERSON, system=SYSTEM, max_new_tokens=40, cache_salt="tenant-b")
    same = eng.run(PASSAGES[1], PERSON, system=SYSTEM, max_new_tokens=40, cache_salt="tenant-a")
    assert first.stats.cached_prompt_tokens == 0 and other.stats.cached_prompt_tokens == 0
    assert same.stats.cached_prompt_tokens > 0 and same.token_ids == other.token_ids


def test_a_request_that_can_never_fit_is_refused_before_it_starts(tok, target, close_draft):
    eng = _engine(tok, target, close_draft, kv_memory=ss.config.KVMemory(active_bytes=50_000))
    with pytest.raises(KVMemoryError, match="active_bytes"):
        eng.run(PASSAGES[0], PERSON, system=SYSTEM, max_new_tokens=40)
    assert eng.cache_info()["lookups"] == 0


def test_same_output_type_shares_the_whole_prompt_up_to_the_users_text(tok, target, close_draft):
    eng = _engine(tok, target, close_draft)
    a = eng.prompt_ids(PASSAGES[0], PERSON, system=SYSTEM)
    b = eng.prompt_ids(PASSAGES[1], PERSON, system=SYSTEM)
    common = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)
    user_start = len(eng.prompt_ids("", PERSON, system=SYSTEM)) - len(tok.encode(
        "<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False))
    assert common >= user_start  # the system prompt and schema instruction come first, in the same tokens


@pytest.mark.parametrize("damage", [None, "delete"])
def test_spill_and_resume_continue_exactly(tok, target, tmp_path, damage):
    rt = OneSequence(target)
    ids = tok.encode(TEXT, add_special_tokens=False)
    prompt, generated, rest = ids[:40], ids[40:55], ids[55:70]
    rt.prefill(prompt)
    rt.extend(generated)
    straight = rt.extend(rest)
    rt.crop(len(prompt) + len(generated))
    store = KVStore([DiskTier(1 << 24, tmp_path)])
    handle = store.spill(SeqKV(prompt + generated, span(rt.kv_layers(), 0, rt.length)))
    rt.prefill(ids[5:30])  # another request runs meanwhile
    if damage:
        next(tmp_path.rglob("*.safetensors")).unlink()
        with pytest.warns(KVLostWarning):
            seq = store.restore(handle)
        assert seq.layers is None and seq.tokens == prompt + generated  # lost: its tokens, to read again
        rt.prefill(seq.tokens)
    else:
        store.prefetch(handle)
        seq = store.restore(handle)
        rt.start(seq.layers, len(seq.tokens))
    assert rt.length == len(prompt) + len(generated)
    assert torch.equal(rt.extend(rest), straight)
