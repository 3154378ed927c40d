"""A sequence's KV as plain tensors: per layer a (key, value) pair of shape [1, kv_heads, length, head_dim], which is
what a transformers DynamicCache layer holds. Everything in runtime/kv stores and returns this form only.

Sharing rule: a sequence's cache grows in place and overwrites what a crop dropped (packed.KVSequence), so its
`views()` are copied at once by whoever receives them (the prefix cache's insert spans them) and what is kept
(a paused row's KV) is `layers()`, copies; this package likewise never hands out a tensor it keeps: it stores
copies and returns fresh concatenations (see test_kv_layers.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

import torch

if TYPE_CHECKING:
    from transformers import PretrainedConfig

KVLayers = list[tuple[torch.Tensor, torch.Tensor]]


@dataclass
class SeqKV:
    """The KV of one sequence and the token ids it was computed from (`layers` may be None: tokens only)."""

    tokens: list[int]
    layers: KVLayers | None = None

    @property
    def nbytes(self) -> int:
        return nbytes(self.layers or [])


def nbytes(layers: KVLayers) -> int:
    return sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in layers)


def length(layers: KVLayers) -> int:
    return int(layers[0][0].shape[-2]) if layers else 0


def span(layers: KVLayers, start: int, end: int) -> KVLayers:
    """Positions [start, end) as new contiguous tensors that share no storage with `layers`."""
    return [(k[:, :, start:end, :].clone(), v[:, :, start:end, :].clone()) for k, v in layers]


def concat(parts: Sequence[KVLayers], device: torch.device | str | None = None) -> KVLayers:
    """Join spans along the sequence: always fresh tensors (torch.cat allocates), on `device` if given."""
    if not parts:
        return []
    out = []
    for i in range(len(parts[0])):
        ks = [p[i][0] if device is None else p[i][0].to(device) for p in parts]
        vs = [p[i][1] if device is None else p[i][1].to(device) for p in parts]
        out.append((torch.cat(ks, dim=-2), torch.cat(vs, dim=-2)))
    return out


def bytes_per_token(config: PretrainedConfig, dtype: torch.dtype = torch.float32) -> int:
    """KV bytes one token takes in a transformers model: 2 x layers x kv_heads x head_dim x element size."""
    cfg = config.get_text_config(decoder=True)
    heads = int(cfg.num_attention_heads)
    kv_heads = int(getattr(cfg, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // heads)
    size = torch.empty((), dtype=dtype).element_size()
    return 2 * int(cfg.num_hidden_layers) * kv_heads * head_dim * size
