"""The shipped pair as it ships (GGUF blocks) on free text: a draft whose LM head computes only the first 32,768
token ids, and the suffix index, each give the target's own greedy output token for token."""

from __future__ import annotations

import os

import pytest
import torch

from specstruct.config import SpecConfig
from specstruct.constraints.base import ConstraintSpec
from specstruct.constraints.compiler import compile_constraint

PROMPT = "Write a short story (about 150 words) about a lighthouse keeper who finds a message in a bottle."


@pytest.fixture(scope="module")
def pair():
    from specstruct import models
    from specstruct.runtime.gguf_model import load_model

    before = torch.get_num_threads()
    torch.set_num_threads(os.cpu_count() or 2)
    target, tok = load_model(models.DEFAULT_TARGET)
    draft, _ = load_model(models.DEFAULT_DRAFT)
    yield target, draft, tok
    torch.set_num_threads(before)


def _run(speculator, tok, **cfg):
    from specstruct.testing import run_alone

    text = tok.apply_chat_template([{"role": "user", "content": PROMPT}], add_generation_prompt=True, tokenize=False)
    ids = tok.encode(text, add_special_tokens=False)
    constraint = compile_constraint(ConstraintSpec("text", None), tok, vocab_size=speculator.target.vocab_size,
                                    eos_token_ids=sorted(speculator.eos))
    return run_alone(speculator.row(ids, constraint, SpecConfig(max_new_tokens=32, **cfg)))


def test_prose_with_a_restricted_draft_head_and_the_suffix_index_is_lossless(pair):
    from specstruct.runtime.draft_head import HeadRestricted
    from specstruct.runtime.model_runtime import ModelRuntime
    from specstruct.spec.speculator import Speculator

    target, draft, tok = pair
    speculator = Speculator(ModelRuntime(target), tok, [tok.eos_token_id],
                            draft=HeadRestricted(ModelRuntime(draft), 32768))
    # plans by acceptance alone (the policy's timing-free mode): the draft model drafts, and a copy's length does not
    # hang on how fast this machine's passes happened to be, so the counts below are the index's, not the clock's
    speculator.policy.use_timing = False
    base = _run(speculator, tok, enable_speculative=False)
    drafted = _run(speculator, tok, cache_salt="a")  # tenant a's index is empty: the draft model drafts
    assert drafted.token_ids == base.token_ids
    assert drafted.stats.per_drafter["model"].proposed > 0
    copied = _run(speculator, tok, use_draft_model=False, cache_salt="a")  # the index holds the run above
    assert copied.token_ids == base.token_ids
    assert copied.stats.per_drafter["suffix"].accepted > len(base.token_ids) // 2
    other = _run(speculator, tok, use_draft_model=False, cache_salt="b")
    assert other.token_ids == base.token_ids and "suffix" not in other.stats.per_drafter
