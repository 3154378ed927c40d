"""Losslessness of speculative decoding on tiny random models over a real byte-level BPE tokenizer.

Greedy: speculative output == target-only output, token for token, for many prompts, output types and drafts
(one that mostly agrees, one that disagrees often, and no draft model at all). Sampling: the distribution of
outputs matches target-only constrained sampling (chi-square; the speculative side decoded in batches of 8).
Rollback: after every step the target cache and the constraint state equal those of a run that never drafted."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from scipy.stats import chi2_contingency

from specstruct.config import SpecConfig
from specstruct.constraints.compiler import compile_constraint
from specstruct.spec.batch import BatchDecoder
from specstruct.spec.speculator import Speculator
from specstruct.constraints.base import ConstraintSpec
from specstruct.runtime.model_runtime import ModelRuntime, quantize_draft
from specstruct.testing import run_alone, steps_alone

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer"},
        "tags": {"type": "array", "items": {"type": "string", "enum": ["math", "code", "poetry"]}, "maxItems": 3},
    },
    "required": ["name", "age", "tags"],
    "additionalProperties": False,
}
SPECS = {
    "json": ConstraintSpec("json", json.dumps(PERSON)),
    "regex": ConstraintSpec("regex", r"(19|20)\d\d-(0[1-9]|1[0-2])-[0-2]\d"),
    "choice": ConstraintSpec("choice", json.dumps(["positive", "negative", "neutral"])),
    "grammar": ConstraintSpec("grammar", 'start: "SELECT " COLS " FROM " NAME ";"\nCOLS: NAME (", " NAME)*\nNAME: /[a-z]{1,8}/'),
    "text": ConstraintSpec("text", None),
    "code": ConstraintSpec("code", None),
}
PROMPTS = [
    "Extract the person from this text: Grace Hopper, 85, invented the compiler. Answer with JSON.",
    '{"name": "Ada Lovelace", "age": 36, "tags": ["math", "code"]} Copy this JSON exactly:',
    "def add(a, b):\n    return a + b\n\nfor i in range(10):\n    print(i)\n",
    "SELECT name, age FROM people WHERE age > 30 ORDER BY name;",
]


def _engine(tok, target, draft):
    return Speculator(ModelRuntime(target), tok, [tok.eos_token_id],
                  draft=ModelRuntime(draft) if draft is not None else None)


def _compile(tok, eng, kind):
    return compile_constraint(SPECS[kind], tok, vocab_size=eng.target.vocab_size, eos_token_ids=[tok.eos_token_id])


def _decode(eng, tok, prompt, constraint, **cfg):
    ids = tok.encode(prompt, add_special_tokens=False)
    return run_alone(eng.row(ids, constraint.fork(), SpecConfig(**cfg)))


@pytest.mark.parametrize("kind", list(SPECS))
@pytest.mark.parametrize("draft_kind", ["close", "close-int8", "close-int8-torchao", "far", "none"])
def test_greedy_speculative_equals_target_only(tok, target, close_draft, far_draft, kind, draft_kind):
    draft = {"close": close_draft, "far": far_draft, "none": None}.get(draft_kind)
    if draft_kind.startswith("close-int8"):  # the default draft numerics on CPU, and torch.ao's
        draft = quantize_draft(close_draft, torchao=draft_kind.endswith("torchao"))
    eng = _engine(tok, target, draft)
    constraint = _compile(tok, eng, kind)
    drafted = 0
    for prompt in PROMPTS:
        base = _decode(eng, tok, prompt, constraint, enable_speculative=False, max_new_tokens=48)
        spec = _decode(eng, tok, prompt, constraint, enable_speculative=True, max_new_tokens=48)
        assert spec.token_ids == base.token_ids, (kind, draft_kind, prompt)
        assert spec.finish_reason == base.finish_reason
        assert base.stats.target_forwards >= spec.stats.target_forwards
        drafted += spec.stats.drafted
    assert drafted > 0  # speculation really ran


def test_speculation_saves_target_passes_on_structured_output(tok, target, close_draft):
    eng = _engine(tok, target, close_draft)
    constraint = _compile(tok, eng, "json")
    base = _decode(eng, tok, PROMPTS[1], constraint, enable_speculative=False, max_new_tokens=64)
    spec = _decode(eng, tok, PROMPTS[1], constraint, enable_speculative=True, max_new_tokens=64)
    assert spec.token_ids == base.token_ids
    assert spec.stats.target_forwards < base.stats.target_forwards
    assert spec.stats.per_drafter["forced"].accepted > 0  # JSON punctuation and keys came for free


SWITCHES = dict(model="use_draft_model", forced="use_forced_text", lookup="use_prompt_lookup",
                guess="use_structure_guesses", suffix="use_suffix_index")


@pytest.mark.parametrize("drafter", list(SWITCHES), ids=[f"{d}-only" for d in SWITCHES])
def test_each_drafter_alone_is_lossless(tok, target, close_draft, drafter):
    drafters = {switch: name == drafter for name, switch in SWITCHES.items()}
    eng = _engine(tok, target, close_draft)
    constraint = _compile(tok, eng, "json")
    for prompt in PROMPTS[:2]:
        base = _decode(eng, tok, prompt, constraint, enable_speculative=False, max_new_tokens=40)
        spec = _decode(eng, tok, prompt, constraint, max_new_tokens=40, **drafters)
        assert spec.token_ids == base.token_ids
        assert set(spec.stats.per_drafter) <= {drafter}


def _snapshots(eng, tok, prompt, constraint, **cfg):
    """(committed length) -> (cache keys of layer 0, constraint mask, forced text) after every step."""
    ids = tok.encode(prompt, add_special_tokens=False)
    dec = eng.row(ids, constraint.fork(), SpecConfig(**cfg))
    snaps = {}
    for _ in steps_alone(dec):
        rt = dec.kv  # the row's own target KV sequence (freed once the row finished)
        if rt is None:
            continue
        keys = rt.cache.layers[0].keys[0, :, : rt.length].clone()
        c = dec.constraint
        snaps[len(dec.token_ids)] = (rt.length - len(ids), keys, c.mask().clone(), c.forced_text(), c.is_final())
    return snaps


def test_rollback_leaves_cache_and_constraint_as_if_never_drafted(tok, target, far_draft):
    eng = _engine(tok, target, far_draft)  # a draft that is often wrong: many rollbacks
    constraint = _compile(tok, eng, "json")
    base = _snapshots(eng, tok, PROMPTS[0], constraint, enable_speculative=False, max_new_tokens=40)
    spec = _snapshots(eng, tok, PROMPTS[0], constraint, enable_speculative=True, max_new_tokens=40)
    assert set(spec) <= set(base) and len(spec) > 3
    for n, (cached, keys, mask, forced, final) in spec.items():
        b_cached, b_keys, b_mask, b_forced, b_final = base[n]
        common = min(cached, b_cached)
        assert torch.equal(keys[:, : keys.shape[1] - cached + common], b_keys[:, : b_keys.shape[1] - b_cached + common])
        assert torch.equal(mask, b_mask) and forced == b_forced and final == b_final


def _sample_outputs(eng, tok, constraint, n, seed0, batch=1, **cfg):
    """n seeded samples, decoded `batch` at a time through one BatchDecoder (continuous batching)."""
    ids = tok.encode(PROMPTS[0], add_special_tokens=False)
    rows = [eng.row(ids, constraint.fork(), SpecConfig(temperature=1.0, seed=seed0 + s, max_new_tokens=8, **cfg))
            for s in range(n)]
    waiting, decoder = list(rows), BatchDecoder(eng)
    while waiting or len(decoder):
        while waiting and len(decoder) < batch:
            decoder.add(waiting.pop(0))
        decoder.step()
    return [tok.decode(r.token_ids) for r in rows]


@pytest.mark.slow
def test_speculative_sampling_matches_target_only_sampling(tok, target, far_draft):
    """Two-sample chi-square over the outputs of a small choice grammar at temperature 1."""
    eng = _engine(tok, target, far_draft)
    constraint = _compile(tok, eng, "choice")
    n = 400
    base = _sample_outputs(eng, tok, constraint, n, 0, enable_speculative=False)
    spec = _sample_outputs(eng, tok, constraint, n, 10_000, batch=8, enable_speculative=True)  # batched
    labels = sorted(set(base) | set(spec))
    table = np.array([[base.count(x) for x in labels], [spec.count(x) for x in labels]])
    assert len(labels) >= 2
    assert chi2_contingency(table).pvalue > 1e-3
