"""Verification rules. The sampling tests are statistical: chi-square goodness of fit at a strict level, with
fixed seeds so they are deterministic. A deliberately wrong residual must be caught by the same test."""

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from specstruct.spec.verify import distribution, verify_greedy, verify_sampling

V = 6


def _dist(seed, mask=None):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(V, generator=g) * 1.5
    mask = torch.ones(V, dtype=torch.bool) if mask is None else mask
    return distribution(logits, mask, temperature=1.0)


def test_greedy_accepts_longest_agreeing_prefix_then_corrects():
    logits = torch.zeros(4, V)
    for i, t in enumerate([2, 3, 1, 5]):
        logits[i, t] = 1.0
    masks = [torch.ones(V, dtype=torch.bool)] * 4
    assert verify_greedy(logits, masks, [2, 3, 1]) == (3, 5)  # all accepted + bonus
    assert verify_greedy(logits, masks, [2, 4, 1]) == (1, 3)  # rejected at 1, target's token instead
    assert verify_greedy(logits[:1], masks[:1], []) == (0, 2)


def test_greedy_respects_the_mask():
    logits = torch.tensor([[0.0, 5.0, 1.0, 0, 0, 0]])
    mask = torch.tensor([True, False, True, True, True, True])
    assert verify_greedy(logits, [mask], []) == (0, 2)


def _first_token(verify, p, q, x, g):
    n, nxt = verify(torch.stack([p, p]), [q], [x], g)
    return x if n == 1 else nxt


def _freqs(verify, p, q, n=20000, seed=0):
    g = torch.Generator().manual_seed(seed)
    counts = np.zeros(V)
    for _ in range(n):
        x = 4 if q is None else int(torch.multinomial(q, 1, generator=g))
        counts[_first_token(verify, p, q, x, g)] += 1
    return counts


def _expected(counts, p):
    e = p.double().numpy()
    return counts.sum() * e / e.sum()


def _wrong_residual(p, q, candidates, g):
    """A classic bug: resample from p itself instead of the residual max(0, p - q)."""
    for i, x in enumerate(candidates):
        qx = 1.0 if q[i] is None else float(q[i][x])
        if float(torch.rand((), generator=g)) < min(1.0, float(p[i, x]) / qx):
            continue
        return i, int(torch.multinomial(p[i], 1, generator=g))
    return len(candidates), int(torch.multinomial(p[len(candidates)], 1, generator=g))


@pytest.mark.parametrize("point_mass", [False, True], ids=["draft-model-q", "point-mass"])
def test_speculative_sampling_matches_target_distribution(point_mass):
    p = _dist(1)
    q = None if point_mass else _dist(2)
    counts = _freqs(verify_sampling, p, q)
    assert chisquare(counts, _expected(counts, p)).pvalue > 1e-3


@pytest.mark.parametrize("point_mass", [False, True], ids=["draft-model-q", "point-mass"])
def test_the_statistical_test_catches_a_wrong_residual(point_mass):
    p = _dist(1)
    q = None if point_mass else _dist(2)
    counts = _freqs(_wrong_residual, p, q)
    assert chisquare(counts, _expected(counts, p)).pvalue < 1e-6


def test_top_p_keeps_the_nucleus_only():
    probs = distribution(torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05])), torch.ones(4, dtype=torch.bool), 1.0, 0.7)
    assert probs[2] == 0 and probs[3] == 0
    assert torch.allclose(probs[:2], torch.tensor([0.625, 0.375]))


def test_greedy_token_is_the_masked_argmax_ties_to_the_lowest_id():
    from specstruct.spec.verify import greedy_token, masked_logits

    gen = torch.Generator().manual_seed(0)
    for trial in range(300):
        logits = torch.randint(-3, 4, (64,), generator=gen).float()  # few values: many ties
        if trial % 5 == 0:
            logits[torch.randint(0, 64, (8,), generator=gen)] = float("-inf")
        mask = torch.rand(64, generator=gen) < (0.05 if trial % 3 == 0 else 0.7)
        mask[int(torch.randint(0, 64, (1,), generator=gen))] = True
        assert greedy_token(logits, mask) == int(torch.argmax(masked_logits(logits, mask)))
