"""The sparse LM head's panel plan (runtime/sparse_head.py) reads bitmask words (a 16-token panel is half a word)
and plans exactly what it plans from the same masks as bools."""

from __future__ import annotations

import pytest
import torch

from specstruct.constraints.base import pack_mask
from specstruct.runtime import sparse_head


def _mask(vocab: int, allowed) -> torch.Tensor:
    m = torch.zeros(vocab, dtype=torch.bool)
    m[list(allowed)] = True
    return m


@pytest.mark.parametrize("vocab", [400, 401, 417, 151_936])
def test_words_plan_the_panels_bools_plan(vocab):
    g = torch.Generator().manual_seed(vocab)
    masks = [_mask(vocab, [3, 40, vocab - 1]), None, torch.ones(vocab, dtype=torch.bool), _mask(vocab, [31, 32]),
             _mask(vocab, [15, 16, 47, 48]), _mask(vocab, torch.randint(0, vocab, (5,), generator=g).tolist()),
             _mask(vocab, range(0, vocab, 16))]
    words = [None if m is None else pack_mask(m) for m in masks]
    for subset in (slice(None), slice(0, 1), slice(3, 6), slice(1, 3)):
        want, got = sparse_head.plan(masks[subset], vocab), sparse_head.plan(words[subset], vocab)
        assert (want is None) == (got is None)
        if want is not None and got is not None:
            assert want[0] == got[0] and torch.equal(want[1], got[1])
    assert sparse_head.plan([pack_mask(_mask(vocab + 32, [3]))], vocab) is None  # not this head's: the whole head


def test_a_panel_is_half_a_word_the_sign_bit_included():
    vocab = 64
    for token, panel in ((0, 0), (15, 0), (16, 1), (31, 1), (32, 2), (63, 3)):
        got = sparse_head.plan([pack_mask(_mask(vocab, [token]))], vocab)
        assert got is not None and got[1].tolist() == [panel], token
