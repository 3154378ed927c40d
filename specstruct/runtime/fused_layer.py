"""A decoder layer's forward in a few calls: the layer of Llama-style models (Qwen2, Llama, Mistral) on the
row-invariant runtime.

transformers' layer runs ~40 small torch ops and module calls around its seven linear layers (RMSNorm's cast,
pow, mean and rsqrt; rotate_half's slices, negation and concatenation; views, transposes, residual adds), each a
few microseconds: at one token per step that is a sixth of a step of the 4-bit 1.5B model. Here the same
computation is three C++ calls (csrc/layer_ops.cpp: RMSNorm, the residual add fused with the next RMSNorm, the
rotary embedding in place) around the linears, the row-wise attention (packed.attend_pass) and SiLU; the
projections that read one input (q, k, v; gate, up) are one kernel call where their GGUF blocks share a format
(quantized.merge_linears: the input quantized once, bitwise the separate calls' outputs).

Every op is row-invariant (a row's result never depends on the other rows of the pass), so the guarantees hold as
on the stock layer. The numerics differ from transformers' in the last bits (the norm's sum order), the same for
every pass. `fused_support` says which models qualify; others keep transformers' layer. Installed as each
layer's own `forward` (model_runtime.make_row_invariant), removed by `unfuse`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from specstruct.runtime import native, packed
from specstruct.runtime.quantized import QuantLinear, QuantWeight, merge_linears

_KERNEL = native.Kernel("specstruct_layer_ops", Path(__file__).parent / "csrc" / "layer_ops.cpp",
                        "the decoder layer's small ops", "decoder layers run transformers' own forward")
MODEL_TYPES = ("qwen2", "llama", "mistral")  # pre-norm RMSNorm, rotary q/k, SiLU-gated MLP, no q/k norms


def fused_support(model: torch.nn.Module) -> tuple[bool, str]:
    """(True, "") when every decoder layer of `model` is the Llama-style layer computed here; else the reason."""
    cfg = model.config
    if cfg.model_type not in MODEL_TYPES:
        return False, f"model type {cfg.model_type!r} is not one of {MODEL_TYPES}"
    if getattr(cfg, "hidden_act", None) != "silu":
        return False, f"activation {getattr(cfg, 'hidden_act', None)!r} is not silu"
    if getattr(cfg, "partial_rotary_factor", 1.0) != 1.0:
        return False, "a partial rotary embedding is in use"
    layers = getattr(getattr(model, "model", None), "layers", None)
    if not layers:
        return False, "no decoder layers at model.layers"
    for layer in layers:
        attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
        parts = [getattr(attn, n, None) for n in ("q_proj", "k_proj", "v_proj", "o_proj")]
        parts += [getattr(mlp, n, None) for n in ("gate_proj", "up_proj", "down_proj")]
        if any(p is None for p in parts) or any(hasattr(attn, n) for n in ("q_norm", "k_norm")):
            return False, f"layer {getattr(attn, 'layer_idx', '?')} is not a plain Llama-style layer"
        for norm in (getattr(layer, "input_layernorm", None), getattr(layer, "post_attention_layernorm", None)):
            if not type(norm).__name__.endswith("RMSNorm") or not hasattr(norm, "variance_epsilon") \
                    or norm.weight.dtype != torch.float32:
                return False, f"{type(norm).__name__} is not a float32 RMSNorm"
    if _KERNEL.load() is None:
        return False, _KERNEL.error or "the layer kernel is not built"
    return True, ""


def fuse(model: torch.nn.Module) -> bool:
    """Give every decoder layer the fused forward where `fused_support` allows (idempotent); True if it did."""
    if not fused_support(model)[0]:
        return False
    for layer in model.model.layers:
        if "forward" not in layer.__dict__:
            attn, mlp = layer.self_attn, layer.mlp
            plan = _Plan(_calls(attn, ["q_proj", "k_proj", "v_proj"]), _calls(mlp, ["gate_proj", "up_proj"]))
            layer.forward = functools.partial(fused_forward, layer, plan)
    return True


@dataclass(frozen=True)
class _Call:
    """x [N, in] -> [N, sum(sizes)]: one linear call computing the outputs of one or more projections: the merged
    blocks of several, or one projection's own module (looked up at each call: it may be replaced, as a draft's
    linears are by int8 ones)."""
    sizes: tuple[int, ...]
    name: str | None = None
    weight: QuantWeight | None = None
    bias: torch.Tensor | None = None


@dataclass(frozen=True)
class _Plan:
    qkv: tuple[_Call, ...]
    gate_up: tuple[_Call, ...]


def _calls(parent: torch.nn.Module, names: list[str]) -> tuple[_Call, ...]:
    """The projections of one input as few kernel calls as their weights allow: block-quantized ones of one format
    merged (quantized.merge_linears), any other one its own call."""
    mods = [getattr(parent, n) for n in names]
    if all(isinstance(m, QuantLinear) for m in mods):
        for n in range(len(mods), 1, -1):  # the longest leading run that merges (q+k+v, else q+k), then the rest
            merged = merge_linears(mods[:n])
            if merged is not None:
                return (_Call(tuple(m.out_features for m in mods[:n]), weight=merged[0], bias=merged[1]),
                        *_calls(parent, names[n:]))
    return tuple(_Call((m.out_features,), name=n) for m, n in zip(mods, names))


def _outputs(parent: torch.nn.Module, calls: tuple[_Call, ...], x: torch.Tensor) -> list[torch.Tensor]:
    out: list[torch.Tensor] = []
    for call in calls:
        if call.weight is None:
            out.append(getattr(parent, call.name).forward(x))
        else:
            out += call.weight.linear(x, call.bias).split(call.sizes, dim=-1)
    return out


def unfuse(model: torch.nn.Module) -> None:
    """transformers' own layer forward again."""
    for layer in getattr(getattr(model, "model", None), "layers", None) or []:
        layer.__dict__.pop("forward", None)


def fused_forward(self, plan: _Plan, hidden_states: torch.Tensor, attention_mask=None, position_ids=None, cache=None,
                  use_cache=False, position_embeddings=None, **kwargs) -> torch.Tensor:
    """transformers' Llama-style decoder layer: h += attn(norm(h)); h += mlp(norm(h)). hidden_states [1, N, C]."""
    b, n, c = hidden_states.shape
    if b != 1 or hidden_states.dtype != torch.float32:  # the packed runtime passes one row of N tokens
        return type(self).forward(self, hidden_states, attention_mask=attention_mask, position_ids=position_ids,
                                  cache=cache, use_cache=use_cache, position_embeddings=position_embeddings, **kwargs)
    if cache is None:  # transformers before 5.2x hands the layer its cache under the older names
        cache = kwargs.pop("past_key_values", None) or kwargs.pop("past_key_value", None)
    ops = _KERNEL.module
    attn, mlp = self.self_attn, self.mlp
    h = hidden_states.reshape(b * n, c)
    x = ops.rms_norm(h, self.input_layernorm.weight, self.input_layernorm.variance_epsilon)
    q, k, v = (t if t.dim() == 2 else t.reshape(b * n, -1) for t in _outputs(attn, plan.qkv, x))
    cos, sin = position_embeddings
    ops.rope_(q, k, cos.reshape(b * n, -1), sin.reshape(b * n, -1))
    d = attn.head_dim
    hq, hkv = q.shape[-1] // d, k.shape[-1] // d
    key, value = k.view(1, n, hkv, d).transpose(1, 2), v.view(1, n, hkv, d).transpose(1, 2)
    if cache is not None:  # a plain forward with transformers' cache (the packed pass routes through its layout)
        key, value = cache.update(key, value, attn.layer_idx)
    out = packed.attend_pass(attn.layer_idx, q.view(n, hkv, hq // hkv, d).permute(1, 2, 0, 3), key, value, attn.scaling)
    o = attn.o_proj.forward(out.reshape(n, hq * d))
    h, x = ops.add_rms_norm(h, o, self.post_attention_layernorm.weight, self.post_attention_layernorm.variance_epsilon)
    gate, up = _outputs(mlp, plan.gate_up, x)
    g = F.silu(gate).mul_(up)
    return h.add_(mlp.down_proj.forward(g)).view(b, n, c)
