"""A causal LM and its KV cache: prefill, extend by k tokens, crop.

On CPU in float32 the model is switched to *row-invariant* numerics, which is what makes speculative
decoding both fast and lossless there:

- Linear layers run through specstruct's fixed-order kernel (fixed_linear.py, csrc/fixed_linear.cpp): every
  output is summed in an order fixed by the input size alone, so a row's result is bitwise the same whether it
  is computed alone or among any other rows, while stock `F.linear` changes a row's last bits with the batch
  size. Its weights are packed once into its panels, on huge pages, replacing the plain ones (no second copy).
  On Qwen2.5-Coder-1.5B it costs about what stock transformers' one-token step does and verifies 8 tokens for
  1.2x one (stock: 2.8x; `python -m benchmarks.forward_cost`, table in docs/benchmarks.md).
- Where that kernel cannot be built (no C++ compiler), or with SPECSTRUCT_LINEAR=onednn, oneDNN computes them
  instead (`torch.ops.mkldnn._linear_pointwise`, linear.py): row-invariant from two rows up, so a lone row is
  padded with a copy of itself, on weights prepacked into oneDNN's layout; ~1.3x stock's one-token step.
  Weights tied to the embeddings stay plain (and go through oneDNN). restore_stock unpacks; deepcopy,
  state_dict / save_pretrained and load_state_dict work on a packed model (linear.PackedWeight).
- Attention (packed.py) is computed row by row over exactly the keys each row may see, per sequence, so a
  token's logits never depend on which other tokens -- of its own sequence or of other sequences packed into the
  same pass -- share the pass, nor on how a prompt is chunked (in C++, csrc/row_attention.cpp, where it builds).

Together these make greedy speculative output token-for-token equal to greedy one-token-at-a-time decoding, for
architectures the row-wise attention computes exactly (`row_invariant_support`); others keep stock numerics.
Batched rows then decode exactly as they would alone. Where the row-wise attention is not exact (see
`row_invariant_support`) sequences are not packed: `forward` runs them one by one with the model's own attention.
"""

from __future__ import annotations

import copy
import inspect
import types
from typing import Sequence

import torch

from specstruct.models.loading import output_rows
from specstruct.runtime import architectures, fixed_linear, half_linear, quantized
from specstruct.runtime.fused_layer import fuse, unfuse
from specstruct.runtime.kv.layers import KVLayers
from specstruct.runtime.linear import PackedWeight, onednn_linear_forward, pack_linears, unpack_linears
from specstruct.runtime.load_memory import file_ranges, own_mapped_tensors, page_out
from specstruct.runtime.owned import forget, hand_over, marks, own, peek
from specstruct.runtime.packed import ATTN_NAME, KVSequence, forward_packed, use_packed_attention


def row_invariant_support(model: torch.nn.Module) -> tuple[bool, str]:
    """(True, "") when the row-wise attention above computes exactly what the model's own attention does: causal
    attention over every cached key -- or over a layer's sliding window, with its soft-capping, for the
    architectures whose attention modules hand those to the attention function (architectures.WINDOWED) --
    routed through transformers' AttentionInterface. Otherwise (False, the reason): a window or a cap elsewhere,
    attention sinks, chunked attention and rotary embeddings scaled by a pass's length would all be computed
    wrongly, silently. tests/unit/runtime/test_row_invariant_support.py checks each."""
    cfg = architectures.config_of(model)
    if not getattr(model, "_supports_attention_backend", False):
        return False, f"{type(model).__name__} does not route attention through transformers' AttentionInterface"
    windowed = cfg.model_type in architectures.WINDOWED
    if getattr(cfg, "attn_logit_softcapping", None) and not windowed:
        return False, "attention-logit soft-capping is in use"
    if getattr(cfg, "attention_chunk_size", None):
        return False, "chunked attention is in use"
    layer_types = getattr(cfg, "layer_types", None)
    window: int | None = getattr(cfg, "sliding_window", None)
    if layer_types is not None:
        sliding = any("sliding" in str(t) or "chunk" in str(t) for t in layer_types)
    else:
        sliding = getattr(cfg, "use_sliding_window", None) is not False and window is not None and window > 0 \
            and window < (getattr(cfg, "max_position_embeddings", 0) or float("inf"))
    if sliding and not windowed:
        return False, f"a sliding window ({window} tokens) is in use"
    if layer_types is not None and any("chunk" in str(t) for t in layer_types):
        return False, "chunked attention is in use"
    rope_ok, why = architectures.rope_support(cfg)
    if not rope_ok:
        return False, why
    for name, mod in model.named_modules():
        if isinstance(getattr(mod, "sinks", None), torch.Tensor):
            return False, f"attention sinks are in use ({name})"
        if getattr(mod, "is_causal", True) is False:
            return False, f"non-causal attention in {name}"
    return True, ""


def row_invariant_available(model: torch.nn.Module) -> bool:
    p = next(model.parameters())
    onednn = bool(torch.backends.mkldnn.is_available())  # type: ignore[no-untyped-call]
    return p.device.type == "cpu" and p.dtype == torch.float32 and onednn


def make_row_invariant(model: torch.nn.Module) -> str:
    """Switch a CPU float32 model to row-invariant numerics in place (idempotent). Returns a description.
    ModelRuntime calls it on a module it owns (owned.py), never on a user's."""
    mark = marks(model)
    if mark.numerics:
        return mark.numerics
    blocks = quantized.describe(model)  # GGUF blocks compute on their kernel whatever the attention
    halves = half_linear.describe(model)  # and 16-bit weights on the fixed-order kernel
    tiles = " + AMX tiles" if blocks and quantized.amx() else ""
    kernels = [f"block-quantized linear, {quantized.simd()}{tiles}"] if blocks else []
    if halves:
        kernels.append(f"16-bit linear, fixed-order kernel, {fixed_linear.built().simd}")
    formats = " + ".join(d for d in (blocks, halves) if d)
    supported, reason = row_invariant_support(model)
    if not row_invariant_available(model) or not supported:
        p = next(model.parameters())
        desc = f"stock ({p.dtype}, {p.device.type})" + (f": not row-invariant because {reason}" if reason else "")
        if formats:  # the attention is the model's own
            desc = f"{formats} weights ({'; '.join(kernels)}); {desc}"
        mark.numerics = desc
        return desc
    fixed = fixed_linear.kernel() is not None
    forward = fixed_linear.fixed_linear_forward if fixed else onednn_linear_forward
    for mod in model.modules():
        if isinstance(mod, torch.nn.Linear):
            mod.forward = types.MethodType(forward, mod)  # type: ignore[method-assign]
    weights = fixed_linear.pack_panels(model) if fixed else pack_linears(model)
    if any(isinstance(getattr(m, "weight", None), PackedWeight) for m in model.modules()):
        own_mapped_tensors(model)  # packed copies replaced the file's weights: let the file's mapping close
    attention = {"cpp": "C++", "torch": "torch ops"}[use_packed_attention(model)]
    if fuse(model):
        attention += ", fused decoder layers"
    linear = "fixed-order linear" if fixed else f"oneDNN linear >=2 rows ({fixed_linear.why_not()})"
    if formats:  # weights as they ship: blocks with int8 activations per group, 16-bit with float32 activations
        if blocks:
            kernels[0] += ", int8 activations per group"
        if halves:
            kernels[-1] += ", float32 activations"
        others = "" if weights.startswith("0 of 0") else f"; other linears {weights}"
        mark.numerics = (f"{formats} weights, row-invariant ({'; '.join(kernels)}{others}; row-wise "
                         f"attention in {attention})")
        return mark.numerics
    mark.numerics = f"float32, row-invariant ({linear}, {weights}; row-wise attention in {attention})"
    return mark.numerics


def restore_stock(model: torch.nn.Module) -> None:
    """Undo make_row_invariant (for baselines that must run the stock transformers numerics): plain weights
    (bitwise the originals), stock Linear forwards, the model's sdpa attention."""
    unpack_linears(model)
    unfuse(model)
    architectures.stock_rotary(model)
    for mod in model.modules():
        if isinstance(mod, torch.nn.Linear) and "forward" in mod.__dict__:
            del mod.forward
    for sub in model.modules():
        cfg = getattr(sub, "config", None)
        if cfg is not None and getattr(cfg, "_attn_implementation", None) == ATTN_NAME:
            cfg._attn_implementation = "sdpa"
    forget(model)


def quantize_draft(model: torch.nn.Module, torchao: bool = False) -> torch.nn.Module:
    """An int8 copy of a CPU draft model: weight-only int8 on the fixed-order kernel where it is built
    (draft_int8.py), else (or with `torchao`) torch.ao's dynamic int8; each about 3x cheaper per step here.

    Safe for losslessness because the target verifies every token: the draft's numerics only change how often
    its proposals are accepted, never what is output. (Not for targets: its per-tensor activation scale makes a
    row's result depend on its neighbours.)"""
    import warnings

    q = copy.deepcopy(model)  # the runtime's own copy (handed over below): `model` stays as it was
    if next(q.parameters()).dtype != torch.float32:  # torch.ao's dynamic int8 kernels take float32 activations
        q = q.float()
    ranges = file_ranges()
    for t in (*model.parameters(), *model.buffers()):  # the copy read `model`'s file pages: reclaim them now
        page_out(t, ranges)
    if not torchao and fixed_linear.kernel() is not None:  # weight-only int8 on specstruct's kernel
        from specstruct.runtime.draft_int8 import quantize

        quantize(q)
        hand_over(q)
        return q
    unpack_linears(q)  # torch.ao reads plain weights; `model` itself keeps its prepacked ones
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao's deprecation notice; the kernel itself is current
        quantized: torch.nn.Module = torch.ao.quantization.quantize_dynamic(  # type: ignore[no-untyped-call]
            q, {torch.nn.Linear}, dtype=torch.qint8, inplace=True)
        q = quantized
    hand_over(q)
    mark = marks(q)
    mark.draft_numerics = "int8 dynamic (torch.ao), draft only"
    mark.rows_coupled = True  # a row's result depends on the other rows of its call
    return q


def cache_kwarg(model: torch.nn.Module) -> str:
    """The name under which `model.forward` takes its KV cache: `cache` from transformers 5.2x, `past_key_values`
    before."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


class ModelRuntime:
    """A transformers causal LM with per-sequence KV caches: packed ragged passes over many sequences (packed.py).
    The spec layer's BatchDecoder is its one caller; `specstruct.testing.OneSequence` drives one sequence for tests."""

    def __init__(self, model: torch.nn.Module, *, row_invariant: bool = True):
        model = own(model).eval()  # a user's module stays as it is: the runtime switches its structural copy
        self.model = model
        switched = make_row_invariant(model) if row_invariant else "stock"
        # what computes; an int8 draft names its own format (a result's stats.numerics shows it after "draft:")
        self.numerics = peek(model).draft_numerics or switched
        self.packed = row_invariant_support(model)[0]  # the packed attention is exact for this architecture
        if self.packed:
            use_packed_attention(model)  # packing needs the segment-aware attention whatever the linear kernel
        self.device = next(model.parameters()).device
        self.vocab_size = output_rows(model)
        self.max_length = int(getattr(model.config, "max_position_embeddings", 0) or 0) or None
        # torch.ao's dynamic int8 (a draft's fallback) scales activations per tensor: rows then depend on their
        # neighbours; the weight-only int8 draft (draft_int8.py) is row-invariant like the target
        self.row_invariant = "row-invariant" in switched and not peek(model).rows_coupled
        # the engine's prefix cache serves this runtime where prefill results do not depend on where a cached
        # prefix ends: row-invariant numerics (linears) and the packed row-wise attention
        self.cache_key = (id(model), self.numerics)  # its namespace in a prefix cache
        self.reuses_prefixes = self.row_invariant and self.packed
        self._cache_arg = cache_kwarg(model)

    def sequence(self, layers: KVLayers | None = None, length: int = 0) -> KVSequence:
        """A new sequence (its own KV cache) for `forward`: empty, or holding a copy of `layers`."""
        return KVSequence(architectures.config_of(self.model), layers, length)

    def forward(self, segments: Sequence[tuple[KVSequence, Sequence[int]]], keep: Sequence[int],
                masks: Sequence[Sequence[torch.Tensor] | None] | None = None) -> list[torch.Tensor]:
        """One packed pass over every (sequence, new tokens); logits of each segment's last keep[i] tokens. With
        `masks` (per segment, the mask of each kept position -- bitmask words or bool, sparse_head.py -- or None) logits a mask excludes may be -inf."""
        if self.packed:
            return forward_packed(self.model, segments, keep, masks)
        return [self._forward_one(seq, ids, want) for (seq, ids), want in zip(segments, keep)]

    @torch.inference_mode()
    def _forward_one(self, seq: KVSequence, ids: Sequence[int], want: int) -> torch.Tensor:
        """The model's own attention over one sequence (architectures the packed attention does not cover)."""
        n = len(ids)
        out = self.model(input_ids=torch.tensor([list(ids)], device=self.device),
                         position_ids=torch.arange(seq.length, seq.length + n, device=self.device).unsqueeze(0),
                         use_cache=True, logits_to_keep=max(want, 1), **{self._cache_arg: seq.cache})
        seq.length += n
        logits: torch.Tensor = out.logits
        return logits[0, logits.shape[1] - want :].float()
