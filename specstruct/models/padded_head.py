"""A draft's LM head with the target's number of logits (drafts whose weights stay as the file ships them)."""

from __future__ import annotations

import torch


class PaddedHead(torch.nn.Module):
    """An LM head giving `rows` logits: its own, cut or followed by -inf for the padding ids past them."""

    def __init__(self, head: torch.nn.Module, rows: int):
        super().__init__()
        self.head, self.out_features = head, rows
        self.in_features = getattr(head, "in_features", None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.head(x)
        extra = self.out_features - y.shape[-1]
        return y[..., : self.out_features] if extra <= 0 else \
            torch.nn.functional.pad(y, (0, extra), value=float("-inf"))
