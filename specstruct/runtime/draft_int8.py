"""A draft model in weight-only int8 on the fixed-order kernel (csrc/fixed_linear.cpp `linear_int8`).

Each Linear weight is rounded to int8 with one scale per output row (symmetric, max |w| -> 127); activations stay
float32 and the kernel widens the int8 weights to float32 as it streams them, so a pass reads a quarter of the
float32 bytes. A draft's numerics never change the output (the target verifies every token), only how often its
proposals are accepted: this replaces torch.ao's dynamic int8 (which also rounds the activations, per tensor) where
the kernel is built; `runtime.quantize_draft` chooses.
"""

from __future__ import annotations

import torch

from specstruct.runtime import fixed_linear
from specstruct.runtime.linear import dense
from specstruct.runtime.owned import marks


class Int8Linear(torch.nn.Module):
    """nn.Linear's computation on int8 weights with a float32 scale per output: y = (x Q^T) * scale + bias."""

    packed: torch.Tensor
    scale: torch.Tensor
    bias: torch.Tensor | None

    def __init__(self, linear: torch.nn.Linear):
        super().__init__()
        w = dense(linear.weight).detach().to(torch.float32)
        scale = (w.abs().amax(dim=1) / 127).clamp_min(torch.finfo(torch.float32).tiny)
        q = torch.round(w / scale[:, None]).clamp_(-127, 127).to(torch.int8)
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.register_buffer("packed", fixed_linear.pack_weight(q))
        self.register_buffer("scale", scale)
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach().to(torch.float32).clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1]).to(torch.float32)
        y = fixed_linear.built().linear_int8(rows, self.packed, self.out_features, self.scale, self.bias)
        return y.reshape(*x.shape[:-1], y.shape[-1])

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 weights (per-row scale)"


def quantize(model: torch.nn.Module) -> None:
    """Replace every nn.Linear of `model` (a private copy) by an Int8Linear, in place."""
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, torch.nn.Linear):
                setattr(parent, name, Int8Linear(child))
    marks(model).draft_numerics = "int8 weight-only (per-row scale, fixed-order kernel), draft only"
