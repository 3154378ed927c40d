"""The draft's LM head over the first token ids only: those logits are bitwise the whole head's, the rest -inf, the
KV unchanged; speculative output with such a draft equals target-only output."""

from __future__ import annotations

import copy
import json

import pytest
import torch

from specstruct.config import SpecConfig
from specstruct.constraints.base import ConstraintSpec
from specstruct.constraints.compiler import compile_constraint
from specstruct.runtime.draft_head import HeadRestricted
from specstruct.runtime.gguf_model import quantize_linears
from specstruct.runtime.model_runtime import ModelRuntime

TOKENS = 200  # of the tiny head's 408 outputs: not a whole number of 16-output panels


@pytest.fixture(scope="module")
def q8_draft(close_draft):
    return quantize_linears(copy.deepcopy(close_draft), "q8_0")


def test_logits_below_the_limit_are_the_whole_heads(q8_draft):
    whole = ModelRuntime(q8_draft)
    inner = ModelRuntime(q8_draft)
    part = HeadRestricted(inner, TOKENS)
    ids = list(range(5, 40))
    a, b = whole.sequence(), part.sequence()
    (la,), (lb,) = whole.forward([(a, ids)], [7]), part.forward([(b, ids)], [7])
    assert torch.equal(la[:, :TOKENS], lb[:, :TOKENS])
    assert bool(torch.isneginf(lb[:, TOKENS:]).all())
    assert a.length == b.length and all(torch.equal(x, y) for x, y in zip(a.layers()[0], b.layers()[0]))
    (la,), (lb,) = whole.forward([(a, [9])], [1]), part.forward([(b, [9])], [1])  # the caches stayed the same
    assert torch.equal(la[:, :TOKENS], lb[:, :TOKENS])
    assert part.cache_key == inner.cache_key and "below 200" in part.numerics  # the inner runtime's KV namespace


def test_refuses_a_head_it_cannot_restrict(close_draft, q8_draft):
    with pytest.raises(ValueError, match="GGUF blocks"):
        HeadRestricted(ModelRuntime(close_draft), TOKENS)
    with pytest.raises(ValueError, match="draft_head_tokens=408"):  # the tiny vocabulary's head has 408 outputs
        HeadRestricted(ModelRuntime(q8_draft), 408)


@pytest.mark.parametrize("kind", ["text", "json"])
def test_speculative_output_with_a_restricted_draft_equals_target_only(tok, target, q8_draft, kind):
    from specstruct.spec.speculator import Speculator
    from specstruct.testing import draft_first, run_alone

    schema = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
              "required": ["name", "age"]}
    spec = ConstraintSpec(kind, json.dumps(schema) if kind == "json" else None)
    # the draft model tried whatever this machine's costs say (the policy's trial gate would rule it out on timing)
    eng = draft_first(Speculator(ModelRuntime(target), tok, [tok.eos_token_id],
                                 draft=HeadRestricted(ModelRuntime(q8_draft), TOKENS)))
    constraint = compile_constraint(spec, tok, vocab_size=eng.target.vocab_size, eos_token_ids=[tok.eos_token_id])
    only = dict(use_forced_text=False, use_prompt_lookup=False, use_suffix_index=False, use_structure_guesses=False)
    drafted = 0
    for prompt in ["Grace Hopper, 85, invented the compiler.", "Tell me a story about the sea."]:
        ids = tok.encode(prompt, add_special_tokens=False)
        base = run_alone(eng.row(ids, constraint.fork(), SpecConfig(enable_speculative=False, max_new_tokens=32)))
        for switches in (only, {}):  # the draft model alone, then with every free proposer
            out = run_alone(eng.row(ids, constraint.fork(), SpecConfig(max_new_tokens=32, **switches)))
            assert out.token_ids == base.token_ids
            model = out.stats.per_drafter.get("model")
            drafted += model.proposed if model is not None else 0
    assert drafted > 0
