"""The LM head over only the tokens a constraint allows: where a step's mask admits a few tokens (a digit, a key,
a closing bracket) the target needs those logits alone, and the head's weights -- a sixth of a one-token step's
bytes on the 1.5B target -- need not all be read.

The block-quantized kernel computes each 16-output panel on its own, in the same order whatever else it computes
(`linear_panels`), so a panel's logits are bitwise the ones the whole head gives: the target's masked argmax and
its masked distribution do not change. A row whose mask allows more than SPARSE_TOKENS tokens gets the whole
head, as does every row when the sparse rows together need more than a quarter of the panels. Logits a row's mask
excludes are -inf (every consumer masks them). Rows without a mask (prefill) get the whole head.

`during(model, masks)` applies it to one forward: the head module's forward is replaced for the call, so the model's
own code runs unchanged around it (the slice of kept positions before, any soft-capping after).
"""

from __future__ import annotations

import contextlib
from typing import Callable, Iterator, Sequence

import torch

from specstruct.runtime.quantized import PANEL, QuantLinear

SPARSE_TOKENS = 2048  # a row whose mask allows at most this many tokens reads only their panels
MAX_SHARE = 0.25  # above this share of the head's panels the whole head is read


def plan(masks: Sequence[torch.Tensor | None], vocab: int, panel: int = PANEL) -> tuple[list[int], torch.Tensor] | None:
    """(the rows that read only some panels, those panels' indices), or None when every row reads the whole head.
    `masks` holds, per kept position, its bool mask [vocab] or None."""
    narrow = [(i, m) for i, m in enumerate(masks) if m is not None and int(m.sum()) <= SPARSE_TOKENS]
    if not narrow:
        return None
    sparse = [i for i, _ in narrow]
    union = torch.stack([m for _, m in narrow]).any(0)
    panels = -(-vocab // panel)
    padded = torch.zeros(panels * panel, dtype=torch.bool)
    padded[: union.numel()] = union
    chosen = padded.view(panels, panel).any(1).nonzero().flatten()
    if chosen.numel() > MAX_SHARE * panels:
        return None
    return sparse, chosen


def head_forward(head: QuantLinear, sparse: list[int], panels: torch.Tensor,
                 panel: int = PANEL) -> Callable[[torch.Tensor], torch.Tensor]:
    """A forward for `head` computing rows `sparse` (of the flattened input) over `panels` only."""
    vocab, bias = head.out_features, head.bias
    assert bias is None or isinstance(bias, torch.Tensor)
    cols = (panels[:, None] * panel + torch.arange(panel)).flatten()
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
        rows = torch.full((len(sparse), vocab), float("-inf"))
        rows[:, cols[valid]] = part
        y[sparse] = rows
        return y.view(*x.shape[:-1], vocab)

    return forward


@contextlib.contextmanager
def during(model: torch.nn.Module, masks: Sequence[torch.Tensor | None] | None) -> Iterator[None]:
    """For one forward of `model`: its LM head reads only the panels the masked rows need (see the module doc)."""
    head = model.get_output_embeddings() if masks is not None else None  # type: ignore[operator]
    chosen = plan(masks, head.out_features) if masks is not None and isinstance(head, QuantLinear) else None
    if chosen is None or not isinstance(head, QuantLinear):
        yield
        return
    head.forward = head_forward(head, *chosen)  # type: ignore[method-assign, assignment]
    try:
        yield
    finally:
        del head.forward
