"""Packed ragged passes: many sequences' new tokens in one [1, N] forward, each attending only to its own KV.

Every sequence keeps its own KV cache (a transformers DynamicCache). A pass concatenates the new tokens of
several sequences (a decode row's pending token and candidates, or a prefill chunk) into one row of N tokens with
per-token position ids. The linear layers then see N rows (row-invariant with the oneDNN kernel of runtime.py),
and attention -- the function registered here -- splits the block back into its segments: each segment's new
K/V are appended to its own cache and each of its queries attends, one by one, to exactly the keys it may see.
There is no padding and no mask, so a sequence's logits are bitwise independent of which other sequences share
the pass and of how its prompt was chunked.

The layout travels to the attention function in a thread-local set around the forward; a call without one (a
plain forward of a model switched to this attention) falls back to row-wise causal attention over its inputs.

The row-wise attention itself is C++ (csrc/row_attention.cpp, one call per layer, built once per machine by
native.py) for float32 on CPU, else torch ops row by row (other dtypes and devices, no compiler, or
SPECSTRUCT_ATTENTION=torch); each is row-invariant, and a model keeps the one it was switched to (the numerics
string names it), so a sequence's cache is never extended by the other.
"""

from __future__ import annotations

import functools
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, Sequence, cast, get_args

import torch

from specstruct.runtime import architectures, native, sparse_head
from specstruct.runtime.kv.layers import KVLayers
from specstruct.runtime.owned import marks, peek
from specstruct.settings import Attention, settings

if TYPE_CHECKING:
    from transformers import PretrainedConfig
    from transformers.cache_utils import DynamicLayer

ATTN_NAME = "specstruct_rowwise"
ATTENTIONS: tuple[str, ...] = get_args(Attention)
# Query rows the C++ attention computes together where a pass has many (a prompt chunk): each key and value loaded
# serves them all, the bits of every row the same as row at a time (1). Probes set it to compare the two.
TILE_ROWS = 8
_KERNEL = native.Kernel("specstruct_row_attention", Path(__file__).parent / "csrc" / "row_attention.cpp",
                        "the row-wise attention kernel", "attention runs as torch ops, row by row")


class _Pass(threading.local):
    """The pass running on this thread: its segments' layout and its row-wise attention (packed_attention reads
    them: transformers calls it with the model's arguments only)."""

    layout: list[_Segment] | None = None
    attention: str | None = None


_local = _Pass()


class _AttentionOps(Protocol):
    """What csrc/row_attention.cpp's extension provides."""

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scaling: float, window: int,
               softcap: float, tile_rows: int) -> torch.Tensor: ...


class KVSequence:
    """One sequence's KV cache on one model, and how many positions it holds.

    A transformers DynamicCache whose full-attention layers grow in place (`_growing_layer`): a DynamicLayer copies
    its whole cache into a new tensor at every step (`torch.cat`), which at 3,000 cached tokens cost 6.3 ms of a
    50 ms step of the int8 0.5B draft and 16 ms of a 289 ms 1.5B step (`bench.step_breakdown`)."""

    def __init__(self, config: PretrainedConfig, layers: KVLayers | None = None, length: int = 0):
        """Empty, or holding `layers` ([(key, value)] per layer, `length` positions; copied, never shared)."""
        from transformers import DynamicCache

        self.cache = DynamicCache(config=config)
        growing, growable = _growing_layer(), _growable()
        # every layer keeps all its positions, sliding-window ones too (the attention skips keys outside the window):
        # a speculative step crops back past positions a window-sized layer would already have dropped
        self.cache.layers = [growing() if type(layer) in growable else layer for layer in self.cache.layers]
        if layers and len(self.cache.layers) < len(layers):  # a version that adds layers lazily: as transformers does
            self.cache = DynamicCache(ddp_cache_data=layers, config=config)
        else:
            for layer, (k, v) in zip(self.cache.layers, layers or []):
                layer.update(k, v)  # type: ignore[union-attr]  # a DynamicLayer: copies into its own buffer
        self.length = length

    def views(self) -> KVLayers:
        """The cache's (key, value) per layer, exactly the positions held, as views of its buffers: for a caller
        that copies what it keeps before the sequence changes again (the prefix cache's insert spans them)."""
        return [(layer.keys, layer.values) for layer in self.cache.layers]  # type: ignore[union-attr, misc]

    def layers(self) -> KVLayers:
        """Copies of `views()`, to keep: the buffers grow in place and are rewritten after a crop."""
        return [(k.clone(), v.clone()) for k, v in self.views()]

    def crop(self, length: int) -> None:
        """Forget cached positions from `length` on."""
        remove = self.length - length
        if remove < 0:
            raise ValueError(f"cannot crop to {length}: only {self.length} positions are cached")
        if remove:
            self.cache.crop(-remove)  # a negative count removes from the end (transformers 4.x and 5.x)
            self.length = length


@functools.cache
def _growable() -> tuple[type, ...]:
    """The cache layer types KVSequence replaces by its growing layer."""
    from transformers.cache_utils import DynamicLayer

    try:
        from transformers.cache_utils import DynamicSlidingWindowLayer
    except ImportError:  # a version without window-sized layers
        return (DynamicLayer,)
    return DynamicLayer, DynamicSlidingWindowLayer


@functools.cache
def _growing_layer() -> type[DynamicLayer]:
    """A transformers DynamicLayer whose keys and values live in buffers that grow by a quarter (at least 256
    positions) when full: `update` writes the new positions in place and `keys` / `values` are views of the
    positions held; `crop` (DynamicLayer's) shortens the views, and the next update overwrites what it dropped."""
    from transformers.cache_utils import DynamicLayer

    class GrowingLayer(DynamicLayer):  # type: ignore[no-untyped-call]
        def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: object,
                   **kwargs: object) -> tuple[torch.Tensor, torch.Tensor]:
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            held, new = self.get_seq_length(), key_states.shape[-2]
            buffers: tuple[torch.Tensor, ...] | None = self.__dict__.get("_kv_buffers")
            if buffers is None or held + new > buffers[0].shape[-2]:
                room = max(held + new, held + held // 4, 256)
                grown = tuple(s.new_empty((*s.shape[:-2], room, s.shape[-1])) for s in (key_states, value_states))
                if held and self.keys is not None and self.values is not None:
                    grown[0][..., :held, :] = self.keys
                    grown[1][..., :held, :] = self.values
                buffers = self._kv_buffers = grown
            buffers[0][..., held : held + new, :] = key_states
            buffers[1][..., held : held + new, :] = value_states
            keys, values = buffers[0][..., : held + new, :], buffers[1][..., : held + new, :]
            self.keys, self.values = keys, values
            return keys, values

    return GrowingLayer


@dataclass
class _Segment:
    seq: KVSequence
    start: int  # offset in the packed block
    size: int


def _attend_rows_torch(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scaling: float, window: int = 0,
                       softcap: float = 0.0) -> torch.Tensor:
    """q [Hkv, g, Lq, D] (the last Lq positions), k/v [Hkv, Lk, D] -> [Lq, Hkv*g, D], each row over its own keys:
    all before it, or with a sliding `window` its last `window` (itself included); `softcap` > 0 caps each score s
    as softcap * tanh(s / softcap) before the softmax.

    Every row goes through exactly these ops with shapes fixed by its own position, so its result does not
    depend on the other rows of the block (nor on how a prompt was cut into blocks)."""
    hkv, g, lq, d = q.shape
    lk = k.shape[1]
    q = q * scaling
    kt = k.transpose(1, 2)  # [Hkv, D, Lk]
    same = v.dtype == torch.float32
    rows = []
    for i in range(lq):
        end = lk - lq + i + 1  # keys visible to row i: [first, end)
        first = max(0, end - window) if window else 0
        s = torch.matmul(q[:, :, i, :], kt[:, :, first:end])
        if softcap:
            s = torch.tanh(s / softcap) * softcap
        p = torch.softmax(s, dim=-1, dtype=torch.float32)
        rows.append(torch.matmul(p if same else p.to(v.dtype), v[:, first:end, :]))  # [Hkv, g, D]
    return torch.stack(rows, dim=0).reshape(lq, hkv * g, d)


def _attend_rows_cpp(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scaling: float, window: int = 0,
                     softcap: float = 0.0) -> torch.Tensor:
    """_attend_rows_torch's computation in one C++ call (float32 CPU tensors; else the torch ops)."""
    if q.dtype == k.dtype == v.dtype == torch.float32 and q.device.type == "cpu":
        return cast(_AttentionOps, _KERNEL.module).attend(q, k, v, scaling, window, softcap, TILE_ROWS)
    return _attend_rows_torch(q, k, v, scaling, window, softcap)


_ATTEND = {"cpp": _attend_rows_cpp, "torch": _attend_rows_torch}


def attention_kernel() -> str:
    """Which row-wise attention a model switched now gets: "cpp" where the kernel builds, unless
    SPECSTRUCT_ATTENTION=torch (benchmarks comparing the two)."""
    name = settings().attention
    return "cpp" if name == "cpp" and _KERNEL.load() is not None else "torch"


def packed_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                     attention_mask: object, scaling: float | None = None, dropout: float = 0.0,
                     sliding_window: int | None = None, softcap: float | None = None,
                     **kwargs: object) -> tuple[torch.Tensor, None]:
    """query [1, H, N, D], key/value [1, Hkv, N, D] (this pass's tokens only) -> ([1, N, H, D], None). The layer's
    sliding window and soft-capping come as transformers' attention modules pass them (model_runtime's
    row_invariant_support lists the architectures that do)."""
    _, h, n, d = query.shape
    hkv = key.shape[1]
    scaling = scaling if scaling is not None else d**-0.5
    out = attend_pass(cast(int, module.layer_idx), query[0].reshape(hkv, h // hkv, n, d), key, value, scaling,
                      sliding_window or 0, softcap or 0.0)
    return out.unsqueeze(0), None


def attend_pass(layer_idx: int, q: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                scaling: float, window: int = 0, softcap: float = 0.0) -> torch.Tensor:
    """One layer's attention over a pass: q [Hkv, g, N, D], key/value [1, Hkv, N, D] (this pass's tokens; views
    are fine) -> [N, Hkv*g, D]. Each segment of the pass's layout appends its keys and values to its own cache
    and attends over it; without a layout (a plain forward) the pass attends causally over its own tokens.
    `window` > 0: each row sees its last `window` keys; `softcap` > 0: scores soft-capped (_attend_rows_torch)."""
    layout = _local.layout
    attend = _ATTEND[_local.attention or attention_kernel()]
    if layout is None:  # a plain causal forward over the given keys (no cache routing)
        return attend(q, key[0], value[0], scaling, window, softcap)
    outs = []
    for seg in layout:
        sl = slice(seg.start, seg.start + seg.size)
        k_all, v_all = seg.seq.cache.update(key[:, :, sl], value[:, :, sl], layer_idx)
        outs.append(attend(q[:, :, sl], k_all[0], v_all[0], scaling, window, softcap))
    return outs[0] if len(outs) == 1 else torch.cat(outs, dim=0)


def register_attention() -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(ATTN_NAME, packed_attention)


def use_packed_attention(model: torch.nn.Module) -> str:
    """Route the model's attention through `packed_attention` (idempotent). Returns which row-wise attention
    computes it ("cpp" or "torch"), chosen the first time and kept for the model's life."""
    register_attention()
    architectures.per_row_rotary(model)  # each row's cos / sin by its own position alone
    for sub in model.modules():  # submodules keep their own config reference in some architectures
        cfg = getattr(sub, "config", None)
        if cfg is not None and hasattr(cfg, "_attn_implementation"):
            cfg._attn_implementation = ATTN_NAME
    mark = marks(model)
    if mark.attention is None:
        mark.attention = attention_kernel()
    return mark.attention


@torch.inference_mode()
def forward_packed(model: torch.nn.Module, segments: Sequence[tuple[KVSequence, Sequence[int]]],
                   keep: Sequence[int], masks: Sequence[Sequence[torch.Tensor] | None] | None = None) -> list[torch.Tensor]:
    """Run every (sequence, new tokens) segment in one pass; each sequence's cache grows by its tokens.

    `keep[i]` is how many of segment i's last positions need logits (0: none, e.g. a prefill chunk that is not
    the last). Returns per segment logits [keep[i], vocab] (float32). `masks[i]`, when given, holds the mask
    (bitmask words or bool [vocab]) of each of those positions: logits it excludes may be -inf (sparse_head.py)."""
    device = next(model.parameters()).device
    ids: list[int] = []
    positions: list[int] = []
    rows: list[int] = []
    layout: list[_Segment] = []
    for (seq, toks), want in zip(segments, keep):
        start = len(ids)
        ids += list(toks)
        positions += range(seq.length, seq.length + len(toks))
        rows += range(start + len(toks) - want, start + len(toks))
        layout.append(_Segment(seq, start, len(toks)))
    if not ids:
        return [torch.empty(0) for _ in segments]
    layer_types = set(getattr(model.config, "layer_types", None) or ["full_attention"])
    _local.layout, _local.attention = layout, peek(model).attention
    kept = None
    if masks is not None:
        if any(seg is not None and len(seg) != want for seg, want in zip(masks, keep)):
            raise ValueError("forward_packed: a segment's masks must number its kept positions (keep[i])")
        kept = [m for seg, want in zip(masks, keep) for m in (seg if seg is not None else [None] * want)]
    try:
        with sparse_head.during(model, kept):
            out = model(
                input_ids=torch.tensor([ids], dtype=torch.long, device=device),
                position_ids=torch.tensor([positions], dtype=torch.long, device=device),
                attention_mask={t: None for t in layer_types},  # no masks: attention reads the layout
                use_cache=False,
                logits_to_keep=torch.tensor(rows or [0], dtype=torch.long, device=device),
            )
    finally:
        _local.layout = _local.attention = None
    for seq, toks in segments:
        seq.length += len(toks)
    logits = out.logits[0].float()
    result, at = [], 0
    for want in keep:
        result.append(logits[at : at + want])
        at += want
    return result
