"""A decoder layer's forward in a few calls: the layers of Qwen2 / 2.5, Qwen3, Llama 2 / 3.x (SmolLM), Mistral,
Gemma 2, Gemma 3 and Phi-3 on the row-invariant runtime (their differences: architectures.py).

transformers' layer runs ~40 small torch ops and module calls around its seven linear layers (RMSNorm's cast,
pow, mean and rsqrt; rotate_half's slices, negation and concatenation; views, transposes, residual adds), each a
few microseconds: at one token per step that is a sixth of a step of the 4-bit 1.5B model. Here the same
computation is three C++ calls (csrc/layer_ops.cpp: RMSNorm, the residual add fused with the next RMSNorm, the
rotary embedding in place; Qwen3's and Gemma 3's per-head q/k norms and Gemma's extra norms and gelu_tanh one call
each more) around the linears, the row-wise attention (packed.attend_pass, with the layer's sliding window and
soft-cap) and the activation; the projections that read one input (q, k, v; gate, up) are one kernel call where
their GGUF blocks share a format (quantized.merge_linears: the input quantized once, bitwise the separate calls'
outputs), or one module's call split by columns (Phi-3's qkv_proj and gate_up_proj).

Every op is row-invariant (a row's result never depends on the other rows of the pass), so the guarantees hold as
on the stock layer. The numerics differ from transformers' in the last bits (the norm's sum order), the same for
every pass. `fused_support` says which models qualify; others keep transformers' layer. Installed as each
layer's own `forward` (model_runtime.make_row_invariant), removed by `unfuse`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, cast

import torch

from specstruct.runtime import native, packed
from specstruct.runtime.load_memory import trim_heap
from specstruct.runtime.architectures import (ACTIVATIONS, ARCHITECTURES, Traits, config_of, layer_softcap,
                                              layer_window, norm_eps)
from specstruct.runtime.quantized import QuantLinear, QuantWeight, merge_linears

if TYPE_CHECKING:
    from transformers.cache_utils import Cache


class _LayerOps(Protocol):
    """What csrc/layer_ops.cpp's extension provides."""

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float, offset: float) -> torch.Tensor: ...

    def head_rms_norm_(self, x: torch.Tensor, weight: torch.Tensor, eps: float, offset: float) -> None: ...

    def rope_(self, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, d: int) -> None: ...

    def add_rms_norm(self, h: torch.Tensor, o: torch.Tensor, weight: torch.Tensor, eps: float, offset: float,
                     residual_norm: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]: ...

    def silu_mul(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor: ...

    def gelu_tanh_mul(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor: ...


class _Norm(Protocol):
    weight: torch.Tensor


class _Attention(Protocol):
    """What the fused forward reads of transformers' attention module."""

    head_dim: int
    layer_idx: int
    scaling: float
    q_norm: _Norm
    k_norm: _Norm
    o_proj: torch.nn.Module


class _Layer(Protocol):
    """What the fused forward reads of transformers' decoder layer."""

    self_attn: _Attention
    mlp: torch.nn.Module
    input_layernorm: _Norm
    post_attention_layernorm: _Norm
    pre_feedforward_layernorm: _Norm
    post_feedforward_layernorm: _Norm


_KERNEL = native.Kernel("specstruct_layer_ops", Path(__file__).parent / "csrc" / "layer_ops.cpp",
                        "the decoder layer's small ops", "decoder layers run transformers' own forward")
MODEL_TYPES = tuple(ARCHITECTURES)


def _names(traits: Traits) -> tuple[list[str], list[str]]:
    """The projections of the attention's input (q, k, v) and of the MLP's (gate, up), as the modules name them."""
    if traits.fused_projections:
        return ["qkv_proj"], ["gate_up_proj"]
    return ["q_proj", "k_proj", "v_proj"], ["gate_proj", "up_proj"]


def _norms(layer: torch.nn.Module, traits: Traits) -> list[str]:
    names = ["input_layernorm", "post_attention_layernorm"]
    return names + ["pre_feedforward_layernorm", "post_feedforward_layernorm"] if traits.sandwich else names


def fused_support(model: torch.nn.Module) -> tuple[bool, str]:
    """(True, "") when every decoder layer of `model` is one computed here (architectures.ARCHITECTURES); else the
    reason."""
    cfg = config_of(model)
    traits = ARCHITECTURES.get(cfg.model_type)
    if traits is None:
        return False, f"model type {cfg.model_type!r} is not one of {MODEL_TYPES}"
    act = getattr(cfg, traits.activation_key, None)
    if act not in ACTIVATIONS:
        return False, f"activation {act!r} is not one of {ACTIVATIONS}"
    layers = getattr(getattr(model, "model", None), "layers", None)
    if not layers:
        return False, "no decoder layers at model.layers"
    qkv, gate_up = _names(traits)
    for layer in layers:
        attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
        parts = [getattr(attn, n, None) for n in [*qkv, "o_proj"]] + [getattr(mlp, n, None) for n in [*gate_up,
                                                                                                  "down_proj"]]
        qk_norms = [getattr(attn, n, None) for n in ("q_norm", "k_norm")]
        if any(p is None for p in parts) or (traits.qk_norm and None in qk_norms) or \
                (not traits.qk_norm and any(n is not None for n in qk_norms)):
            return False, f"layer {getattr(attn, 'layer_idx', '?')} is not a {cfg.model_type} layer as expected"
        norms = [getattr(layer, n, None) for n in _norms(layer, traits)] + (qk_norms if traits.qk_norm else [])
        for norm in norms:
            if not isinstance(norm, torch.nn.Module) or norm_eps(norm) is None or \
                    cast(torch.Tensor, norm.weight).dtype != torch.float32:
                return False, f"{type(norm).__name__} is not a float32 RMSNorm"
        if traits.sandwich and norm_eps(layer.post_attention_layernorm) != norm_eps(layer.pre_feedforward_layernorm):
            return False, "the norms around the residual add have different epsilons"
    if _KERNEL.load() is None:
        return False, _KERNEL.error or "the layer kernel is not built"
    return True, ""


def fuse(model: torch.nn.Module) -> bool:
    """Give every decoder layer the fused forward where `fused_support` allows (idempotent); True if it did."""
    if not fused_support(model)[0]:
        return False
    cfg = config_of(model)
    traits = ARCHITECTURES[cfg.model_type]
    qkv, gate_up = _names(traits)
    for layer in cast("list[torch.nn.Module]", model.get_submodule("model.layers")):
        if "forward" not in layer.__dict__:
            attn, mlp = cast(torch.nn.Module, layer.self_attn), cast(torch.nn.Module, layer.mlp)
            d: int = cast(int, attn.head_dim)
            hq: int = cfg.num_attention_heads
            hkv: int = cfg.num_key_value_heads
            eps = norm_eps(cast(torch.nn.Module, layer.input_layernorm))
            assert eps is not None  # fused_support checked every norm
            plan = _Plan(_calls(attn, qkv, (hq * d, hkv * d, hkv * d)), _calls(mlp, gate_up, (cfg.intermediate_size,) * 2),
                         traits, eps, layer_window(attn, cfg), layer_softcap(attn),
                         getattr(cfg, traits.activation_key) == "silu")
            layer.forward = functools.partial(fused_forward, cast(_Layer, layer), plan)
            trim_heap()  # the layer's separate blocks, merged above, are free: give their pages back before the next
    return True


@dataclass(frozen=True)
class _Call:
    """x [N, in] -> [N, sum(sizes)], split by `sizes`: one linear call computing the outputs of one or more
    projections: the merged blocks of several, or one projection's own module (looked up at each call: it may be
    replaced, as a draft's linears are by int8 ones), Phi-3's computing several outputs by rows."""
    sizes: tuple[int, ...]
    name: str | None = None
    weight: QuantWeight | None = None
    bias: torch.Tensor | None = None


@dataclass(frozen=True)
class _Plan:
    qkv: tuple[_Call, ...]
    gate_up: tuple[_Call, ...]
    traits: Traits
    eps: float
    window: int  # the layer's sliding window (0: none)
    softcap: float  # its attention-logit soft-cap (0: none)
    silu: bool  # else gelu_pytorch_tanh


def _calls(parent: torch.nn.Module, names: list[str], sizes: tuple[int, ...]) -> tuple[_Call, ...]:
    """The projections of one input as few kernel calls as their weights allow: block-quantized ones of one format
    merged (quantized.merge_linears), any other one its own call; one module (Phi-3's) split into `sizes`."""
    if len(names) == 1:
        return (_Call(sizes, name=names[0]),)
    mods = [getattr(parent, n) for n in names]
    if all(isinstance(m, QuantLinear) for m in mods):
        for n in range(len(mods), 1, -1):  # the longest leading run that merges (q+k+v, else q+k), then the rest
            merged = merge_linears(mods[:n])
            if merged is not None:
                rest = _calls(parent, names[n:], sizes[n:]) if n < len(names) else ()
                return (_Call(tuple(m.out_features for m in mods[:n]), weight=merged[0], bias=merged[1]), *rest)
    return tuple(_Call((m.out_features,), name=n) for m, n in zip(mods, names))


def _outputs(parent: torch.nn.Module, calls: tuple[_Call, ...], x: torch.Tensor) -> list[torch.Tensor]:
    out: list[torch.Tensor] = []
    for call in calls:
        y = parent.get_submodule(call.name or "").forward(x) if call.weight is None else \
            call.weight.linear(x, call.bias)
        out += y.split(call.sizes, dim=-1) if len(call.sizes) > 1 else [y]
    return out


def unfuse(model: torch.nn.Module) -> None:
    """transformers' own layer forward again."""
    for layer in getattr(getattr(model, "model", None), "layers", None) or []:
        layer.__dict__.pop("forward", None)


def fused_forward(self: _Layer, plan: _Plan, hidden_states: torch.Tensor, attention_mask: object = None,
                  position_ids: torch.Tensor | None = None, cache: Cache | None = None, use_cache: bool = False,
                  position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
                  **kwargs: object) -> torch.Tensor:
    """transformers' decoder layer: h += attn(norm(h)); h += mlp(norm(h)) (Gemma: h += norm(attn(norm(h))),
    h += norm(mlp(norm(h)))). hidden_states [1, N, C]."""
    b, n, c = hidden_states.shape
    if b != 1 or hidden_states.dtype != torch.float32:  # the packed runtime passes one row of N tokens
        layer = cast(torch.nn.Module, self)
        stock: torch.Tensor = type(layer).forward(layer, hidden_states, attention_mask=attention_mask,
                                                  position_ids=position_ids, cache=cache, use_cache=use_cache,
                                                  position_embeddings=position_embeddings, **kwargs)
        return stock
    if cache is None:  # transformers before 5.2x hands the layer its cache under the older names
        cache = cast("Cache | None", kwargs.pop("past_key_values", None) or kwargs.pop("past_key_value", None))
    ops, t, eps = cast(_LayerOps, _KERNEL.module), plan.traits, plan.eps
    assert position_embeddings is not None  # transformers' decoder hands every layer its cos / sin
    attn, mlp = self.self_attn, self.mlp
    h = hidden_states.reshape(b * n, c)
    x = ops.rms_norm(h, self.input_layernorm.weight, eps, t.norm_offset)
    q, k, v = (y if y.dim() == 2 else y.reshape(b * n, -1) for y in _outputs(cast(torch.nn.Module, attn), plan.qkv, x))
    d = attn.head_dim
    if t.qk_norm:
        ops.head_rms_norm_(q, attn.q_norm.weight, eps, t.norm_offset)
        ops.head_rms_norm_(k, attn.k_norm.weight, eps, t.norm_offset)
    cos, sin = position_embeddings
    ops.rope_(q, k, cos.reshape(b * n, -1), sin.reshape(b * n, -1), d)
    hq, hkv = q.shape[-1] // d, k.shape[-1] // d
    key, value = k.view(1, n, hkv, d).transpose(1, 2), v.view(1, n, hkv, d).transpose(1, 2)
    if cache is not None:  # a plain forward with transformers' cache (the packed pass routes through its layout)
        key, value = cache.update(key, value, attn.layer_idx)
    out = packed.attend_pass(attn.layer_idx, q.view(n, hkv, hq // hkv, d).permute(1, 2, 0, 3), key, value,
                             attn.scaling, plan.window, plan.softcap)
    o = attn.o_proj.forward(out.reshape(n, hq * d))
    if t.sandwich:
        h, x = ops.add_rms_norm(h, o, self.pre_feedforward_layernorm.weight, eps, t.norm_offset,
                                self.post_attention_layernorm.weight)
    else:
        h, x = ops.add_rms_norm(h, o, self.post_attention_layernorm.weight, eps, t.norm_offset)
    gate, up = _outputs(mlp, plan.gate_up, x)
    g = ops.silu_mul(gate, up) if plan.silu else ops.gelu_tanh_mul(gate, up)
    y: torch.Tensor = cast(torch.nn.Module, mlp.down_proj).forward(g)
    if t.sandwich:
        y = ops.rms_norm(y, self.post_feedforward_layernorm.weight, eps, t.norm_offset)
    return h.add_(y).view(b, n, c)
