"""Budgets: build the tiers a configuration asks for, and refuse a request whose KV can never fit."""

from __future__ import annotations

from typing import Any

import torch

from specstruct.errors import KVMemoryError

from .layers import bytes_per_token
from .prefix_cache import PrefixCache
from .store import KVStore
from .tiers import DiskTier, MemoryTier

MiB = 2**20


def build(prefix_cache_bytes: int, kv_memory: Any, device: torch.device | str = "cpu") -> tuple[PrefixCache,
                                                                                              KVStore]:
    """The prefix cache (resident tier on `device`, then the lower tiers) and the spill store (lower tiers only).
    On a GPU the lower tiers are pinned host memory, then disk; on CPU, disk."""
    device = torch.device(device)
    lower: list[Any] = []
    if device.type == "cuda" and kv_memory.pinned_bytes > 0:
        from .pinned import PinnedTier

        lower.append(PinnedTier(kv_memory.pinned_bytes, device))
    if kv_memory.disk_bytes > 0:
        lower.append(DiskTier(kv_memory.disk_bytes, kv_memory.directory))
    cache = PrefixCache([MemoryTier(prefix_cache_bytes, device)] + (lower if prefix_cache_bytes > 0 else []))
    # the store gets tiers of its own (same kinds and budgets), so a burst of preemptions never evicts prefixes
    store_tiers: list[Any] = []
    if device.type == "cuda" and kv_memory.pinned_bytes > 0:
        from .pinned import PinnedTier

        store_tiers.append(PinnedTier(kv_memory.pinned_bytes, device))
    if kv_memory.disk_bytes > 0:
        store_tiers.append(DiskTier(kv_memory.disk_bytes, kv_memory.directory))
    return cache, KVStore(store_tiers)


class KVBudget:
    """How many KV bytes one running request needs (target + draft), checked before it starts."""

    def __init__(self, active_bytes: int | None, *models: Any, headroom_tokens: int = 17):
        self.active_bytes = active_bytes
        self.per_token = sum(bytes_per_token(m.config, _kv_dtype(m)) for m in models if m is not None)
        self.headroom = headroom_tokens  # a verification pass appends up to max candidates + 1 before cropping

    def check(self, prompt_tokens: int, max_new_tokens: int) -> None:
        if not self.active_bytes:
            return
        need = (prompt_tokens + max_new_tokens + self.headroom) * self.per_token
        if need > self.active_bytes:
            raise KVMemoryError(
                f"this request needs up to {need / MiB:.0f} MiB of KV ({prompt_tokens} prompt + {max_new_tokens} "
                f"new tokens at {self.per_token / 1024:.0f} KiB per token, target and draft), over "
                f"kv_memory.active_bytes={self.active_bytes / MiB:.0f} MiB: shorten the prompt, lower "
                "max_new_tokens, or raise SpecConfig.kv_memory.active_bytes")


def _kv_dtype(model: Any) -> torch.dtype:
    for p in model.parameters():
        if p.is_floating_point():
            return p.dtype
    return torch.float32
