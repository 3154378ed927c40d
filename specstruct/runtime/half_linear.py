"""16-bit weights as a GGUF file ships them (F16, BF16), computed without widening them in memory.

A F16 or BF16 Linear weight is packed once, from the mapped file a few panels at a time, into the fixed-order
kernel's panels in its own 16-bit type (fixed_linear.pack_weight); the kernel widens each value to float32 as it
loads it (exact: fp16 by F16C, bf16 by a shift) and sums every output in the float32 kernel's order, which
depends on the input size alone. So a row's result is bitwise the same alone or among any rows, on every vector
unit, and bitwise the float32 kernel's on the widened weights; a pass streams half the bytes float32 would.

`HalfLinear` replaces an nn.Linear and `HalfEmbedding` an nn.Embedding (it widens only the rows looked up; a
tied LM head computes on the embedding's own panels). Both hold the panels as a buffer: there is no float32
`.weight`.
"""

from __future__ import annotations

import numpy as np
import torch

from specstruct.runtime import fixed_linear
from specstruct.runtime.quantized import format_counts

DTYPES = {"F16": torch.float16, "BF16": torch.bfloat16}  # GGUF type name -> the panels' dtype
_NAMES = {v: k for k, v in DTYPES.items()}


def available() -> bool:
    """Whether the fixed-order kernel runs here (the 16-bit weights need it; else they are widened on load)."""
    return fixed_linear.kernel() is not None


class HalfWeight:
    """A [out, in] 16-bit weight in the fixed-order kernel's panels: `packed` [P, in, NB] float16 or bfloat16."""

    def __init__(self, packed: torch.Tensor, out_features: int):
        if packed.dtype not in _NAMES:
            raise ValueError(f"16-bit panels are float16 or bfloat16, not {packed.dtype}")
        self.packed, self.out_features, self.in_features = packed, out_features, packed.shape[1]

    @property
    def name(self) -> str:
        """The GGUF type it came from: "F16" or "BF16"."""
        return _NAMES[self.packed.dtype]

    @staticmethod
    def pack(weight: torch.Tensor) -> "HalfWeight":
        """From a [out, in] float16 / bfloat16 tensor (a view of the mapped file is read a few panels at a time)."""
        if weight.dtype not in _NAMES:
            raise ValueError(f"a 16-bit weight is float16 or bfloat16, not {weight.dtype}")
        return HalfWeight(fixed_linear.pack_weight(weight), weight.shape[0])

    @staticmethod
    def from_gguf(type_name: str, data: np.ndarray, out_features: int, in_features: int) -> "HalfWeight":
        """From a GGUF tensor's raw bytes ([out, 2 * in] uint8, a view of the mapped file)."""
        if type_name not in DTYPES:
            raise ValueError(f"GGUF type {type_name} is not a 16-bit float ({', '.join(DTYPES)} are)")
        raw = np.asarray(data).reshape(out_features, 2 * in_features).view(np.int16)
        return HalfWeight.pack(torch.from_numpy(raw).view(DTYPES[type_name]))

    @property
    def nbytes(self) -> int:
        return self.packed.numel() * self.packed.element_size()

    def linear(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """x [M, in] float32 -> [M, out]."""
        return fixed_linear.built().linear(x, self.packed, self.out_features, bias)

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """The float32 weights of outputs `ids` (any shape) -> [*ids.shape, in], widened exactly."""
        flat = ids.reshape(-1)
        nb = self.packed.shape[2]
        picked = self.packed[torch.div(flat, nb, rounding_mode="floor"), :, flat % nb]  # [n, in]
        return picked.to(torch.float32).view(*ids.shape, self.in_features)

    def dequantize(self) -> torch.Tensor:
        return self.rows(torch.arange(self.out_features))


class HalfLinear(torch.nn.Module):
    """nn.Linear's computation on a HalfWeight: y = x W^T + b, float32 activations and results."""

    packed: torch.Tensor
    bias: torch.Tensor | None

    def __init__(self, weight: HalfWeight, bias: torch.Tensor | None = None):
        super().__init__()
        self.hweight = weight
        self.in_features, self.out_features = weight.in_features, weight.out_features
        self.register_buffer("packed", weight.packed)
        self.register_buffer("bias", None if bias is None else bias.detach().to(torch.float32).contiguous())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype != torch.float32:
            x = x.float()
        rows = x.reshape(-1, x.shape[-1])
        if torch.is_grad_enabled():  # the kernel has no autograd formula
            rows = rows.detach()
        y = self.hweight.linear(rows, self.bias)
        return y if x.dim() == 2 else y.view(*x.shape[:-1], y.shape[-1])

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, {self.hweight.name}"


class HalfEmbedding(torch.nn.Module):
    """nn.Embedding on a HalfWeight: each looked-up row widened to float32 (times the model's embed_scale, if any)."""

    def __init__(self, weight: HalfWeight, embed_scale: torch.Tensor | None = None, padding_idx: int | None = None):
        super().__init__()
        self.hweight = weight
        self.num_embeddings, self.embedding_dim = weight.out_features, weight.in_features
        self.padding_idx = padding_idx
        self.register_buffer("packed", weight.packed)
        self.embed_scale = embed_scale

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        out = self.hweight.rows(ids)
        return out if self.embed_scale is None else out * self.embed_scale.to(out.dtype)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, {self.hweight.name}"


def describe(model: torch.nn.Module) -> str | None:
    """"F16 x169 + BF16 x1" for a model with 16-bit layers, else None."""
    return format_counts(m.hweight.name for m in model.modules() if isinstance(m, (HalfLinear, HalfEmbedding)))


def is_half(model: torch.nn.Module) -> bool:
    """Whether `model` computes any layer on 16-bit panels (it then runs as it ships: no int8 draft copy)."""
    return any(isinstance(m, (HalfLinear, HalfEmbedding)) for m in model.modules())
