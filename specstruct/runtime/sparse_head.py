"""The LM head over only the tokens a constraint allows: where a step's mask admits a few tokens (a digit, a key,
a closing bracket) the target needs those logits alone, and the head's weights -- a sixth of a one-token step's
bytes on the 1.5B target -- need not all be read.

The block-quantized kernel computes each 16-output panel on its own, in the same order whatever else it computes
(`linear_panels`), so a panel's logits are bitwise the ones the whole head gives: the target's masked argmax and
its masked distribution do not change. A row reads only some panels when its mask's tokens lie in at most
MAX_SHARE of them, and the pass does when those rows' panels together do; other rows, rows without a mask
(prefill) and masks of another length read the whole head. A sparse row's logits outside the panels it reads are
-inf (or what a model's soft-capping makes of it; inside them every logit is real): every consumer masks them.

`during(model, masks)` applies it to one forward: the head module's forward is replaced for the call, so the model's
own code runs unchanged around it (the slice of kept positions before, any soft-capping after).
"""

from __future__ import annotations

import contextlib
from typing import Callable, Iterator, Sequence

import torch

from specstruct.runtime.quantized import PANEL, QuantLinear

MAX_SHARE = 0.25  # a row reads only some panels when its tokens lie in at most this share of them (and so must the pass's)
assert PANEL == 16  # a panel is half a bitmask word; _panels reads a panel's 16 mask bytes as two words


def _panels(mask: torch.Tensor) -> torch.Tensor:
    """bool [panels]: whether each 16-output panel holds a token `mask` allows (a last partial panel padded)."""
    if mask.numel() % PANEL:
        mask = torch.cat([mask, mask.new_zeros(PANEL - mask.numel() % PANEL)])
    try:
        words = mask.contiguous().view(torch.int64).view(-1, PANEL // 8)  # 16 bools: two words, or-ed
    except RuntimeError:  # storage not aligned for a word view
        return mask.reshape(-1, PANEL).any(1)
    return (words[:, 0] | words[:, 1]).ne(0)


def _word_panels(words: torch.Tensor, panels: int) -> torch.Tensor:
    """bool [panels] of a bitmask (int32 words, 32 tokens each, bit t % 32 of word t // 32): a word's low half is
    panel 2w, its high half panel 2w + 1, so the words read as 16-bit halves (little-endian, as the words are
    written) are the panels."""
    return words.contiguous().view(torch.int16)[:panels].ne(0)


def plan(masks: Sequence[torch.Tensor | None], vocab: int) -> tuple[list[int], torch.Tensor] | None:
    """(the rows that read only some panels, those panels' indices), or None when every row reads the whole head.
    `masks` holds, per kept position, its mask or None: the constraint's bitmask words (int32 [ceil(vocab / 32)],
    read as they are) or a bool mask [vocab]. A few word operations per mask: it runs on every pass."""
    n_panels = -(-vocab // PANEL)
    limit = int(MAX_SHARE * n_panels)
    rows: list[int] = []
    union: torch.Tensor | None = None
    for i, m in enumerate(masks):
        if m is None:
            continue  # no mask (prefill): the whole head
        if m.dtype == torch.int32 and m.numel() == -(-vocab // 32):
            panels = _word_panels(m, n_panels)
        elif m.dtype == torch.bool and m.numel() == vocab:
            panels = _panels(m)
        else:
            continue  # not one of this head's masks: the whole head
        if int(panels.sum()) > limit:
            continue
        rows.append(i)
        union = panels if union is None else union | panels
    if union is None:
        return None
    chosen = union.nonzero().flatten()
    return None if chosen.numel() > limit else (rows, chosen)


def head_forward(head: QuantLinear, sparse: list[int], panels: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
    """A forward for `head` computing rows `sparse` (of the flattened input) over `panels` only."""
    vocab, bias = head.out_features, head.bias
    assert bias is None or isinstance(bias, torch.Tensor)
    cols = (panels[:, None] * PANEL + torch.arange(PANEL)).flatten()
    valid = cols < vocab

    def forward(x: torch.Tensor) -> torch.Tensor:
        h = x.reshape(-1, x.shape[-1]).float()
        n = h.shape[0]
        y = torch.empty(n, vocab, dtype=torch.float32)
        skip = set(sparse)
        dense = [i for i in range(n) if i not in skip]
        if dense:
            y[dense] = head.qweight.linear(h[dense], bias)
        part = head.qweight.linear_panels(h[sparse], panels)[:, valid]
        if bias is not None:
            part = part + bias[cols[valid]]
        at = torch.tensor(sparse)
        y.index_fill_(0, at, float("-inf"))
        y[at[:, None], cols[valid]] = part
        return y.view(*x.shape[:-1], vocab)

    return forward


@contextlib.contextmanager
def during(model: torch.nn.Module, masks: Sequence[torch.Tensor | None] | None) -> Iterator[None]:
    """For one forward of `model`: its LM head reads only the panels the masked rows need (see the module doc)."""
    head = model.get_output_embeddings() if masks is not None else None  # type: ignore[operator]
    if masks is None or not isinstance(head, QuantLinear) or (chosen := plan(masks, head.out_features)) is None:
        yield
        return
    head.forward = head_forward(head, *chosen)  # type: ignore[method-assign, assignment]
    try:
        yield
    finally:
        del head.forward
