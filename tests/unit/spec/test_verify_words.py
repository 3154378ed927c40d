"""Verification reads the constraint's bitmask words (constraints.base) as it reads bool masks: the same greedy
choices, acceptances and sampling distributions, bit for bit."""

from __future__ import annotations

import pytest
import torch

from specstruct.constraints.base import pack_mask
from specstruct.spec.verify import distribution, greedy_token, masked_logits, verify_greedy


def _case(vocab: int, k: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(k + 1, vocab, generator=g)
    masks = [torch.rand(vocab, generator=g) < 0.05 for _ in range(k + 1)]
    for m in masks:
        m[int(torch.randint(0, vocab, (1,), generator=g))] = True
    return logits, masks


@pytest.mark.parametrize("vocab", [6, 32, 401, 151_936])
def test_greedy_and_distributions_are_the_same_from_words(vocab):
    logits, masks = _case(vocab, 4, vocab)
    words = [pack_mask(m) for m in masks]
    for i in range(5):
        assert greedy_token(logits[i], words[i]) == greedy_token(logits[i], masks[i])
        assert torch.equal(masked_logits(logits[i], words[i]), masked_logits(logits[i], masks[i]))
        for temperature, top_p in ((1.0, 1.0), (0.7, 0.9)):
            assert torch.equal(distribution(logits[i], words[i], temperature, top_p),
                               distribution(logits[i], masks[i], temperature, top_p))
    target = [greedy_token(logits[i], masks[i]) for i in range(5)]
    for cands in (target[:4], target[:2] + [target[2] + 1], []):
        assert verify_greedy(logits, words, cands) == verify_greedy(logits, masks, cands)


def test_the_unmasked_argmax_is_read_from_its_word_alone():
    logits = torch.tensor([0.0] * 40)
    logits[37] = 5.0
    allowed = torch.zeros(40, dtype=torch.bool)
    allowed[[3, 37]] = True
    assert greedy_token(logits, pack_mask(allowed)) == 37
    allowed[37] = False
    assert greedy_token(logits, pack_mask(allowed)) == 3
