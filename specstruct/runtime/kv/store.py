"""Spill and restore whole sequences: the KV of a request that is not running (preempted, a paused stream, a
conversation between turns) moves to a lower tier and comes back when it runs again.

    handle = store.spill(SeqKV(tokens, layers))   # layers leave the active tier
    store.prefetch(handle)                        # when the request is next in line: read back in the background
    seq = store.restore(handle)                   # SeqKV with layers, or with layers=None: re-prefill seq.tokens

Each tier keeps to its byte budget; a sequence that fits in none, or whose write fails (a full, unwritable or
deleted spill folder), keeps only its token ids, and a spill file that is missing or corrupted reads back as tokens
only (both with a KVLostWarning): re-prefilling the tokens is always correct. The scheduler decides whom to
preempt; this only moves the bytes."""

from __future__ import annotations

import threading
import warnings
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Sequence

from specstruct.runtime.openmp import releasing
from specstruct.runtime.kv.layers import KVLayers, SeqKV, nbytes
from specstruct.runtime.kv.prefix_cache import KVLostWarning
from specstruct.runtime.kv.tiers import Slot, Tier


@dataclass
class SpillHandle:
    tokens: list[int]
    tier: int | None = None  # index into the store's tiers; None: token ids only
    slot: Slot | None = None
    loading: Future[KVLayers | None] | None = field(default=None, repr=False)


class KVStore:
    def __init__(self, tiers: Sequence[Tier]):
        self.tiers = list(tiers)
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        self._n = dict(spills=0, spilled_bytes=0, restores=0, tokens_only=0, lost=0)

    def spill(self, seq: SeqKV) -> SpillHandle:
        """Move `seq`'s layers to the first tier with room (the caller drops its own reference)."""
        handle = SpillHandle(list(seq.tokens))
        size = nbytes(seq.layers or [])
        failed = None
        with self._lock:
            self._n["spills"] += 1
            for i, tier in enumerate(self.tiers):
                if seq.layers and tier.used + size <= tier.budget:
                    try:
                        handle.tier, handle.slot = i, tier.put(seq.layers)
                    except Exception as err:  # noqa: BLE001 - a full, unwritable or vanished disk: the next
                        # tier, else the token ids only. Not just OSError: safetensors raises its own
                        # SafetensorError (a plain Exception) for I/O errors, and a pinned tier may fail to allocate
                        failed = err
                        continue
                    self._n["spilled_bytes"] += size
                    return handle
            self._n["tokens_only"] += 1
        if failed is not None:
            warnings.warn(f"the KV of a {len(handle.tokens)}-token sequence could not be spilled ({failed}): it will "
                          "be prefilled again from its token ids (the output is unaffected)", KVLostWarning,
                          stacklevel=2)
        return handle

    def prefetch(self, handle: SpillHandle) -> None:
        """Start reading `handle` back on a background thread; `restore` then waits for it."""
        with self._lock:
            if handle.slot is None or handle.loading is not None:
                return
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="specstruct-kv-restore")
            handle.loading = self._pool.submit(releasing(self._read), handle)

    def restore(self, handle: SpillHandle) -> SeqKV:
        """The sequence back, its layers on the tier's device (None when they are lost or were never stored: the
        caller re-prefills `tokens`). The handle is spent afterwards."""
        with self._lock:
            loading = handle.loading
        stored = handle.slot is not None
        layers = loading.result() if loading is not None else self._read(handle)
        self.discard(handle)
        with self._lock:
            self._n["restores"] += 1
            self._n["lost"] += stored and layers is None
        if stored and layers is None:  # warned here, in the caller's thread, not in the prefetch thread
            warnings.warn(f"the spilled KV of a {len(handle.tokens)}-token sequence was missing or corrupted: it "
                          "is prefilled again from its token ids (the output is unaffected)", KVLostWarning,
                          stacklevel=2)
        return SeqKV(handle.tokens, layers)

    def _read(self, handle: SpillHandle) -> KVLayers | None:
        return None if handle.slot is None or handle.tier is None else self.tiers[handle.tier].get(handle.slot)

    def discard(self, handle: SpillHandle) -> None:
        """Free what `handle` holds (a cancelled request)."""
        with self._lock:
            if handle.slot is not None and handle.tier is not None:
                self.tiers[handle.tier].free(handle.slot)
                handle.slot = handle.tier = None

    def info(self) -> dict[str, Any]:
        with self._lock:
            return dict(self._n, bytes={t.name: t.used for t in self.tiers},
                        budgets={t.name: t.budget for t in self.tiers})

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
        for t in self.tiers:
            t.close()
