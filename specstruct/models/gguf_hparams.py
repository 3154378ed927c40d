"""What a GGUF file's metadata says about its model that transformers' GGUF config conversion leaves out.

transformers reads a GGUF file's config through a per-architecture table of llama.cpp's keys (integrations/ggml.py)
that misses some of them, and the config class's defaults then stand in: one checkpoint's values, wrong for
another. Each entry below reads the key as llama.cpp's runtime does (src/models/<arch>.cpp) and sets the config field
transformers' model computes with:

- `attention.key_length` is the head dimension (Qwen3, Gemma: not hidden / heads; Qwen3's config defaults to 128)
- Gemma 2's `attn_logit_softcapping` and `final_logit_softcapping`, Gemma 3's final one (absent: none)
- Gemma's query scale: llama.cpp scales by 1/sqrt(head dimension), by 1/sqrt(hidden / heads) for the 27B models
  (recognised by their layer count, as llama.cpp does); transformers' config defaults query_pre_attn_scalar to 256
- the sliding window (`attention.sliding_window`) and which layers slide (`attention.sliding_window_pattern`, else
  llama.cpp's fixed pattern: every 2nd layer of Gemma 2 is global, every 6th of Gemma 3); Phi-3's window
- the rotary embedding: its linear scaling (`rope.scaling.type`, `rope.scaling.factor`; Gemma 3: global layers only,
  the local ones at `rope.freq_base_swa`), its YaRN scaling (Qwen2.5's and Qwen3's long context: the factor,
  `rope.scaling.original_context_length`, the `rope.scaling.yarn_*` betas and attention factor), Phi-3's rotary
  width (`rope.dimension_count`: partial_rotary_factor) and its longrope factors (the converter writes them as the
  tensors rope_factors_long / rope_factors_short)

Llama 3's rotary scaling ships as a tensor of per-frequency divisors (`rope_freqs.weight`), not as keys:
runtime.gguf_model applies it to the rotary embedding's frequencies.
"""

from __future__ import annotations

import math
from pathlib import Path
from specstruct.models.gguf_header import Header, read_header

Fields = dict[str, object]  # config fields (JSON values), and the file's metadata values by key

_KEYS = ("attention.key_length", "attn_logit_softcapping", "final_logit_softcapping", "attention.sliding_window",
         "attention.sliding_window_pattern", "rope.scaling.type", "rope.scaling.factor", "rope.freq_base",
         "rope.freq_base_swa", "rope.dimension_count", "rope.scaling.original_context_length", "block_count",
         "embedding_length", "attention.head_count", "context_length", "rope.scaling.attn_factor",
         "rope.scaling.yarn_attn_factor", "rope.scaling.yarn_beta_fast", "rope.scaling.yarn_beta_slow")
# llama.cpp's sliding-window pattern where a file states none (src/models/gemma2.cpp, gemma3.cpp), and the layer
# count of the 27B model whose query scale is 1/sqrt(hidden / heads)
_GEMMA = {"gemma2": (2, 46), "gemma3": (6, 62)}


def hparams(path: str | Path) -> Fields:
    """The config fields GGUF file `path` states that transformers' conversion drops (an empty dict for an
    architecture with none)."""
    arch = read_header(path, ("general.architecture",)).values.get("general.architecture")
    if arch not in ("qwen3", "gemma2", "gemma3", "phi3", "llama", "qwen2"):
        return {}
    header = read_header(path, tuple(f"{arch}.{k}" for k in _KEYS))
    meta = {k: header.values[f"{arch}.{k}"] for k in _KEYS if f"{arch}.{k}" in header.values}
    out: Fields = {}
    if "attention.key_length" in meta:
        out["head_dim"] = int(meta["attention.key_length"])
    if arch in _GEMMA:
        out.update(_gemma(arch, meta))
    elif arch == "phi3":
        out.update(_phi3(meta, _factors(path, header)))
    else:
        rope = _rope(meta)
        if rope is not None:
            out["rope_parameters"] = rope
    return out


def _rope(meta: Fields, default_theta: float = 10000.0) -> Fields | None:
    """The rotary parameters for linear or YaRN scaling (None: none stated: the conversion's default rotary
    stands)."""
    kind = meta.get("rope.scaling.type")
    if kind not in ("linear", "yarn") or not meta.get("rope.scaling.factor"):
        return None
    rope: Fields = {"rope_type": kind, "factor": float(meta["rope.scaling.factor"]),
                    "rope_theta": float(meta.get("rope.freq_base", default_theta))}
    if kind == "yarn":
        rope.update(_yarn(meta))
    return rope


def _yarn(meta: Fields) -> Fields:
    """YaRN's parameters in transformers' names. The original context is the training one where the file states
    none (llama.cpp's n_ctx_orig_yarn). The betas and the attention factor are the model config's own, which the
    converter writes where the config states them (llama.cpp's Qwen and Llama graphs use the defaults, 32 and 1,
    the values every Qwen2.5 / Qwen3 config has). Without a stated attention factor the magnitude scale is
    0.1 ln(factor) + 1 (transformers' and llama.cpp's), times `rope.scaling.attn_factor` where a file states one,
    as llama.cpp multiplies it. (`yarn_ext_factor`, the ramp's weight, is 1 for every model transformers knows;
    llama.cpp's graphs for these architectures do not read it.)"""
    context = meta.get("rope.scaling.original_context_length", meta.get("context_length"))
    out: Fields = {"original_max_position_embeddings": int(context) if context else None}
    for key, field in (("yarn_beta_fast", "beta_fast"), ("yarn_beta_slow", "beta_slow")):
        if meta.get(f"rope.scaling.{key}"):
            out[field] = float(meta[f"rope.scaling.{key}"])
    factor = float(meta["rope.scaling.factor"])
    extra = float(meta.get("rope.scaling.attn_factor", 1.0))
    if meta.get("rope.scaling.yarn_attn_factor") is not None:
        out["attention_factor"] = float(meta["rope.scaling.yarn_attn_factor"])
    elif extra != 1.0:
        out["attention_factor"] = (0.1 * math.log(factor) + 1.0 if factor > 1 else 1.0) * extra
    return out


def _gemma(arch: str, meta: Fields) -> Fields:
    pattern, layers_27b = _GEMMA[arch]
    layers = int(meta["block_count"])
    head_dim = int(meta.get("attention.key_length", 256))
    hidden, heads = int(meta["embedding_length"]), int(meta["attention.head_count"])
    out: Fields = {
        "query_pre_attn_scalar": hidden // heads if layers == layers_27b else head_dim,
        "final_logit_softcapping": float(meta["final_logit_softcapping"]) if meta.get("final_logit_softcapping")
        else None,
    }
    if arch == "gemma2":
        out["attn_logit_softcapping"] = float(meta.get("attn_logit_softcapping", 50.0))
    window = int(meta.get("attention.sliding_window", 4096 if arch == "gemma2" else 0))
    stated = meta.get("attention.sliding_window_pattern", pattern)
    if isinstance(stated, list):  # a flag per layer: True slides
        sliding = [bool(s) for s in stated]
    else:  # every n-th layer is global (llama_hparams::set_swa_pattern)
        sliding = [i % int(stated) < int(stated) - 1 for i in range(layers)]
    if window <= 0:
        sliding = [False] * layers
    out["sliding_window"] = window or None
    out["layer_types"] = ["sliding_attention" if s else "full_attention" for s in sliding]
    if arch == "gemma3":
        full = _rope(meta, 1_000_000.0) or {"rope_type": "default",
                                             "rope_theta": float(meta.get("rope.freq_base", 1_000_000.0))}
        local = {"rope_type": "default", "rope_theta": float(meta.get("rope.freq_base_swa", 10000.0))}
        out["rope_parameters"] = {"full_attention": full, "sliding_attention": local}
    return out


def _factors(path: str | Path, header: Header) -> dict[str, list[float]]:
    """Phi-3's longrope factors, which the converter writes as the F32 tensors rope_factors_long / _short."""
    import numpy as np

    out = {}
    for info in header.tensors:
        kind = info.name.removeprefix("rope_factors_").removesuffix(".weight")
        if info.name.startswith("rope_factors_") and kind in ("long", "short") and info.kind == 0:  # F32
            data = np.fromfile(path, dtype=np.float32, count=int(np.prod(info.dims)),
                               offset=header.data_start + info.offset)
            out[f"{kind}_factor"] = [float(x) for x in data]
    return out


def _phi3(meta: Fields, factors: dict[str, list[float]]) -> Fields:
    out: Fields = {}
    window = int(meta.get("attention.sliding_window", 0))
    out["sliding_window"] = window or None
    hidden, heads = int(meta["embedding_length"]), int(meta["attention.head_count"])
    head_dim = hidden // heads
    rope: Fields = {"rope_type": "default", "rope_theta": float(meta.get("rope.freq_base", 10000.0))}
    rope["partial_rotary_factor"] = int(meta.get("rope.dimension_count", head_dim)) / head_dim
    if "rope.scaling.original_context_length" in meta:
        out["original_max_position_embeddings"] = int(meta["rope.scaling.original_context_length"])
    if len(factors) == 2:  # longrope: the short factors up to the original context, the long ones past it
        rope.update(rope_type="longrope", **factors)
        # (its rope.scaling.attn_factor is the converter's sqrt(1 + ln(scale) / ln(original)): transformers' own)
        rope["original_max_position_embeddings"] = out.get("original_max_position_embeddings")
    out["rope_parameters"] = rope
    return out
