"""Verification of draft candidates against the target, as pure functions.

Notation (Leviathan et al. 2023; Chen et al. 2023): p_i is the target's distribution at candidate position i
(masked by the constraint and renormalised, after temperature and top-p), q_i the drafter's. With k candidates
x_1..x_k the target supplies k+1 distributions p_0..p_k; p_k gives the bonus token when all are accepted.
"""

from __future__ import annotations

from typing import Sequence

import torch

from specstruct.constraints.base import unpack_words, word_allows

NEG_INF = float("-inf")

# A mask here is either bool [V] or the constraint's bitmask words (int32 [ceil(V / 32)], constraints.base): the
# decoder passes words, read one word at a time where one token is asked about and unpacked where all are.


def _bools(mask: torch.Tensor, vocab: int) -> torch.Tensor:
    return mask if mask.dtype == torch.bool else unpack_words(mask, vocab)


def _allows(mask: torch.Tensor, token: int) -> bool:
    return bool(mask[token]) if mask.dtype == torch.bool else word_allows(mask, token)


def masked_logits(logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """logits [V] with illegal tokens at -inf. `mask` is bool [V] or bitmask words; it is never modified."""
    return logits.masked_fill(~_bools(mask, logits.shape[-1]), NEG_INF)


def greedy_token(logits: torch.Tensor, mask: torch.Tensor) -> int:
    """The target's choice under the mask (ties go to the lowest id, as torch.argmax does). Where the unmasked
    argmax is allowed it is the answer (no lower id holds its value), and the mask need not be applied."""
    top = int(torch.argmax(logits))
    if _allows(mask, top):
        return top
    return int(torch.argmax(masked_logits(logits, mask)))


def distribution(logits: torch.Tensor, mask: torch.Tensor, temperature: float, top_p: float = 1.0) -> torch.Tensor:
    """The sampling distribution [V]: mask, then temperature, then top-p (nucleus) over the legal tokens."""
    probs = torch.softmax(masked_logits(logits, mask) / temperature, dim=-1)
    if top_p < 1.0:
        sorted_p, order = torch.sort(probs, descending=True)
        keep = (sorted_p.cumsum(-1) - sorted_p) < top_p  # keep tokens until the mass before them reaches top_p
        keep[0] = True
        kept = torch.zeros_like(probs).scatter_(0, order, sorted_p * keep)
        probs = kept / kept.sum()
    return probs


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    return int(torch.multinomial(probs, 1, generator=generator))


def verify_greedy(
    logits: torch.Tensor, masks: Sequence[torch.Tensor], candidates: Sequence[int]
) -> tuple[int, int]:
    """logits [k+1, V], masks k+1 (bool [V] or bitmask words), k candidates -> (accepted count n, next token).

    Accepts the longest prefix on which the target's masked argmax equals the candidate; the next token is the
    target's own choice after it (the correction, or the bonus token when all k were accepted).
    """
    for i, x in enumerate(candidates):
        t = greedy_token(logits[i], masks[i])
        if t != x:
            return i, t
    k = len(candidates)
    return k, greedy_token(logits[k], masks[k])


def verify_sampling(
    p: torch.Tensor,
    q: Sequence[torch.Tensor | None],
    candidates: Sequence[int],
    generator: torch.Generator | None,
) -> tuple[int, int]:
    """Speculative sampling. p [k+1, V] target distributions; q[i] the drafter's distribution [V] for candidate i,
    or None for a point mass on x_i (zero-cost drafters: forced text, prompt lookup, structure guesses).

    Accept x_i with probability min(1, p_i(x_i) / q_i(x_i)); on rejection sample from the residual
    norm(max(0, p_i - q_i)), which for a point mass is p_i with x_i removed. The output is distributed exactly as
    sampling from p token by token.
    """
    for i, x in enumerate(candidates):
        qi = q[i]
        q_x = 1.0 if qi is None else float(qi[x])
        p_x = float(p[i, x])
        u = float(torch.rand((), generator=generator))
        if q_x > 0 and u < min(1.0, p_x / q_x):
            continue
        if qi is None:
            residual = p[i].clone()
            residual[x] = 0.0
        else:
            residual = torch.clamp(p[i] - qi, min=0.0)
        total = float(residual.sum())
        if total <= 0.0:  # p == q up to rounding: the residual is empty, p itself is the right law
            residual, total = p[i], float(p[i].sum())
        return i, sample(residual / total, generator)
    k = len(candidates)
    return k, sample(p[k], generator)
