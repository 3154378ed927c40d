"""The prefill hook a runtime calls: reuse the longest cached prefix, run the rest in chunks, cache the result.

Chunks end at absolute multiples of `chunk` positions, so where a prefix ends never changes how a position is
computed: with row-invariant numerics (align=1) any prefix length reproduces a cold prefill bit for bit; with
numerics that are not row-invariant (an int8 draft, stock GPU kernels) prefixes are used in whole chunks
(align=chunk), which reproduces it too."""

from __future__ import annotations

from typing import Hashable, Protocol, Sequence

import torch

from specstruct.runtime.kv.layers import KVLayers
from specstruct.runtime.kv.prefix_cache import PrefixCache
from specstruct.runtime.kv.store import KVStore, SpillHandle


class PrefillTarget(Protocol):
    """What a runtime offers the hook: start a sequence from given KV, append tokens, show its KV."""

    def start(self, layers: KVLayers, length: int) -> None: ...

    def extend(self, ids: Sequence[int], *, last_only: bool = False) -> torch.Tensor: ...

    def kv_layers(self) -> KVLayers: ...  # views, valid until the sequence changes: insert copies them


def chunked_extend(target: PrefillTarget, ids: Sequence[int], start: int, chunk: int) -> torch.Tensor:
    """Append `ids` (the sequence holds `start` positions) in blocks cut at multiples of `chunk`; returns the
    logits after the last id, shape [vocab]."""
    ids = list(ids)
    if not ids:
        raise ValueError("nothing to prefill: at least one token must run")
    i, pos = 0, start
    logits = None
    while i < len(ids):
        n = min(len(ids) - i, chunk - pos % chunk)
        logits = target.extend(ids[i : i + n], last_only=True)
        i, pos = i + n, pos + n
    return logits[-1]


def cached_prefill(target: PrefillTarget, ids: Sequence[int], *, cache: PrefixCache | None, namespace: Hashable,
                   chunk: int, align: int = 1) -> tuple[torch.Tensor, int]:
    """Start `target` on `ids`; returns (logits after the last id, prompt tokens taken from the cache).
    At least the last id always runs: its logits are needed."""
    ids = list(ids)
    use = cache is not None and cache.enabled
    hit = cache.lookup(namespace, ids[:-1], align=align) if use else None
    try:
        n = hit.tokens if hit else 0
        target.start(hit.layers if n else [], n)  # a copy: the cache's spans are free to move from here on
    finally:
        if hit is not None:
            hit.release()
    logits = chunked_extend(target, ids[n:], n, chunk)
    if use:
        cache.insert(namespace, ids, target.kv_layers())
    return logits, n


def resume(target: PrefillTarget, handle: SpillHandle, store: KVStore, chunk: int) -> bool:
    """Bring a spilled sequence back into `target`: its KV when the store still has it, else a re-prefill of its
    tokens (same KV under the same numerics). True when the KV was restored without recomputation."""
    seq = store.restore(handle)
    if seq.layers is not None:
        target.start(seq.layers, len(seq.tokens))
        return True
    target.start([], 0)
    chunked_extend(target, seq.tokens, 0, chunk)
    return False
