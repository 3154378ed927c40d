"""The suffix index: copies from a tenant's own earlier requests, never from another tenant's, within its memory bound;
and through a real row, lossless against target-only decoding."""

from __future__ import annotations

import random

import pytest

from specstruct.config import SpecConfig
from specstruct.constraints.base import ConstraintSpec
from specstruct.constraints.compiler import compile_constraint
from specstruct.spec.proposers.suffix import END, KEY, SuffixIndex, SuffixIndexDrafter, TenantIndex


def _brute_force(docs: list[list[int]], context: list[int], k: int, max_match: int = 32) -> list[int]:
    """The reference: over every earlier position of every remembered request, the longest match of the end of
    `context` (at least KEY tokens, at most max_match), the most recent on ties, and what followed it."""
    best, best_len = None, 0
    for d, doc in enumerate(docs):
        for end in range(KEY - 1, len(doc) - 1):  # a match followed by at least one token
            n = 0
            while n < min(max_match, len(context)) and end - n >= 0 and doc[end - n] == context[-n - 1]:
                n += 1
            if n >= KEY and n >= best_len:
                best, best_len = (d, end), n
    if best is None:
        return []
    d, end = best
    return docs[d][end + 1 : end + 1 + k]


def test_copies_what_followed_the_longest_match():
    index = TenantIndex()
    index.add([1, 2, 3, 4, 5, 6])
    index.add([9, 2, 3, 4, 7, 8])  # the same key, more recent, a shorter match for the context below
    assert index.follow([0, 1, 2, 3, 4], 2) == [5, 6]
    assert index.follow([0, 2, 3, 4], 3) == [7, 8]  # equal matches: the most recent wins; a copy stops at its end
    assert index.follow([0, 3, 4], 3) == []  # shorter than KEY
    assert index.follow([7, 7, 7], 3) == []


def test_matches_the_brute_force_reference():
    rng = random.Random(0)
    for _ in range(200):
        docs = [[rng.randrange(4) for _ in range(rng.randrange(1, 30))] for _ in range(rng.randrange(1, 4))]
        index = TenantIndex()
        for d in docs:
            index.add(d)
        context = [rng.randrange(4) for _ in range(rng.randrange(1, 12))]
        kept = [d for d in docs if len(d) >= KEY + 1]
        assert index.follow(context, 5) == _brute_force(kept, context, 5), (docs, context)


def test_a_copy_never_crosses_into_the_next_request():
    index = TenantIndex()
    index.add([1, 2, 3, 4])
    index.add([5, 6, 7, 8])
    assert index.follow([1, 2, 3], 5) == [4]
    assert END not in index.follow([2, 3, 4], 5)


def test_each_tenant_reads_only_its_own_requests():
    index = SuffixIndex()
    index.add("alice", [1, 2, 3, 4, 5])
    index.add("bob", [1, 2, 3, 9, 9])
    index.add(None, [1, 2, 3, 7, 7])  # the unsalted requests are a tenant of their own
    assert index.follow("alice", [1, 2, 3], 2) == [4, 5]
    assert index.follow("bob", [1, 2, 3], 2) == [9, 9]
    assert index.follow(None, [1, 2, 3], 2) == [7, 7]
    assert index.follow("carol", [1, 2, 3], 2) == []


def test_memory_stays_bounded():
    index = SuffixIndex(tenant_tokens=100, total_tokens=250)
    rng = random.Random(1)
    for i in range(200):
        index.add(f"t{i % 5}", [rng.randrange(50) for _ in range(rng.randrange(5, 60))])
        assert all(len(t) <= 100 for t in index.tenants.values())
        assert index.tokens() <= 250
    one = TenantIndex(limit=100)
    for _ in range(50):
        one.add(list(range(40)))
    assert len(one) <= 100 and one.follow([0, 1, 2], 3) == [3, 4, 5]  # the newest requests are kept
    assert len(one.head) <= 100


@pytest.fixture()
def text(tok, target):
    return compile_constraint(ConstraintSpec("text", None), tok, vocab_size=target.config.vocab_size,
                              eos_token_ids=[tok.eos_token_id])


def test_a_row_copies_from_its_tenants_earlier_output_losslessly(tok, target, text):
    from specstruct.runtime.model_runtime import ModelRuntime
    from specstruct.spec.speculator import Speculator
    from specstruct.testing import run_alone

    spec = Speculator(ModelRuntime(target), tok, [tok.eos_token_id])
    assert isinstance(spec.drafters["suffix"], SuffixIndexDrafter)
    prompt = tok.encode("Tell me about the lighthouse keeper and the bottle.", add_special_tokens=False)
    only = dict(use_forced_text=False, use_prompt_lookup=False, use_structure_guesses=False, max_new_tokens=40,
                max_candidates={"text": 8})

    def run(**cfg):
        return run_alone(spec.row(prompt, text.fork(), SpecConfig(**{**only, **cfg})))

    base = run(enable_speculative=False)
    assert spec.drafters["suffix"].index.tokens() == 0  # speculation off: nothing remembered
    first = run(cache_salt="alice")
    again = run(cache_salt="alice")
    other = run(cache_salt="bob")
    assert first.token_ids == again.token_ids == other.token_ids == base.token_ids
    assert "suffix" not in first.stats.per_drafter  # nothing remembered yet
    assert again.stats.per_drafter["suffix"].accepted >= len(base.token_ids) - 4  # the output, copied (less each
    # pass's own token)
    assert again.stats.target_forwards <= base.stats.target_forwards // 2
    assert "suffix" not in other.stats.per_drafter  # alice's requests are never proposed to bob
    off = run(cache_salt="carol", use_suffix_index=False)
    assert "carol" not in spec.drafters["suffix"].index.tenants and off.token_ids == base.token_ids
