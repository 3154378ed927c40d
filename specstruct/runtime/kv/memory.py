"""Budgets: build the tiers a configuration asks for, and refuse a request whose KV can never fit."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import torch

from specstruct.errors import KVMemoryError

from specstruct.runtime.kv.layers import bytes_per_token
from specstruct.runtime.kv.prefix_cache import PrefixCache
from specstruct.runtime.kv.store import KVStore
from specstruct.runtime.kv.tiers import DiskTier, MemoryTier

MiB = 2**20
# Tokens a row's KV may run past its prompt + output during one step, by default: a verification pass appends its
# candidates + 1 to the target cache before cropping, and the draft cache runs as far ahead. 17 covers 16 candidates,
# twice the default caps (config.DEFAULT_CAPS); a row whose config allows more counts the rest (`extra_headroom`).
DEFAULT_HEADROOM = 17


def build(prefix_cache_bytes: int, kv_memory: Any, device: torch.device | str = "cpu") -> tuple[PrefixCache,
                                                                                              KVStore]:
    """The prefix cache (resident tier on `device`, then the lower tiers) and the spill store (lower tiers only).
    On a GPU the lower tiers are pinned host memory, then disk; on CPU, disk."""
    device = torch.device(device)
    if kv_memory.disk_bytes > 0 and kv_memory.directory:
        check_directory(kv_memory.directory)
    lower: list[Any] = []
    if device.type == "cuda" and kv_memory.pinned_bytes > 0:
        from specstruct.runtime.kv.pinned import PinnedTier

        lower.append(PinnedTier(kv_memory.pinned_bytes, device))
    if kv_memory.disk_bytes > 0:
        lower.append(DiskTier(kv_memory.disk_bytes, kv_memory.directory))
    cache = PrefixCache([MemoryTier(prefix_cache_bytes, device)] + (lower if prefix_cache_bytes > 0 else []))
    # the store gets tiers of its own (same kinds and budgets), so a burst of preemptions never evicts prefixes
    store_tiers: list[Any] = []
    if device.type == "cuda" and kv_memory.pinned_bytes > 0:
        from specstruct.runtime.kv.pinned import PinnedTier

        store_tiers.append(PinnedTier(kv_memory.pinned_bytes, device))
    if kv_memory.disk_bytes > 0:
        store_tiers.append(DiskTier(kv_memory.disk_bytes, kv_memory.directory))
    return cache, KVStore(store_tiers)


def check_directory(directory: str) -> None:
    """kv_memory.directory must be a folder this process can create and write, checked when the engine is built
    (not at the first spill, on the scheduler's thread, as a raw OSError)."""
    from specstruct.errors import InvalidParameterError

    path = Path(directory)
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = tempfile.NamedTemporaryFile(dir=path)
        probe.close()
    except OSError as e:
        raise InvalidParameterError(f"kv_memory.directory={directory!r} cannot hold spill files ({e.strerror or e}): "
                                    "give a writable folder, or disk_bytes=0 to spill nowhere") from None


def close_all(*closers: Any) -> None:
    """Call each closer in order: an engine's shutdown (its scheduler, then its KV tiers and their spill files)."""
    for close in closers:
        close()


class KVBudget:
    """The active tier: KV bytes of all running requests together (target + draft) against
    `kv_memory.active_bytes`. `check` refuses, before it starts, a request that could not fit even alone; the
    scheduler pauses rows (engine/preempt.py) when the running ones together would not fit."""

    def __init__(self, active_bytes: int | None, *models: Any, headroom_tokens: int = DEFAULT_HEADROOM):
        self.active_bytes = active_bytes
        self.per_token = sum(bytes_per_token(m.config, _kv_dtype(m)) for m in models if m is not None)
        self.headroom = headroom_tokens  # every row's; one with a larger cap adds extra_headroom (preempt.held)

    def need(self, tokens: int) -> int:
        """Bytes a row holding `tokens` needs through its next step (a verification pass's headroom added)."""
        return (tokens + self.headroom) * self.per_token

    def check(self, prompt_tokens: int, max_new_tokens: int) -> None:
        if not self.active_bytes:
            return
        need = self.need(prompt_tokens + max_new_tokens)
        if need > self.active_bytes:
            raise KVMemoryError(
                f"this request alone needs up to {_size(need)} of KV ({prompt_tokens} prompt + {max_new_tokens} "
                f"new tokens at {_size(self.per_token)} per token, target and draft), over "
                f"kv_memory.active_bytes={_size(self.active_bytes)}: shorten the prompt, lower "
                "max_new_tokens, or raise EngineConfig.kv_memory.active_bytes")


def extra_headroom(config: Any, mode: str | None = None) -> int:
    """Tokens beyond DEFAULT_HEADROOM that one step of a request with this SpecConfig may add to its caches: its
    largest candidates cap (for `mode`, else over all modes) + 1, less the default; 0 for the default caps. Per
    request, not per engine: a call's config may raise max_candidates up to config.MAX_CAP (64)."""
    caps = [config.cap(mode)] if mode is not None else list(config.max_candidates.values())
    longest = max(caps, default=0) if config.enable_speculative else 0
    return max(0, longest + 1 - DEFAULT_HEADROOM)


def _size(n: int) -> str:
    return f"{n / MiB:.0f} MiB" if n >= 10 * MiB else f"{n / 1024:.0f} KiB" if n >= 10 * 1024 else f"{n} bytes"


def _kv_dtype(model: Any) -> torch.dtype:
    for p in model.parameters():
        if p.is_floating_point():
            dtype: torch.dtype = p.dtype
            return dtype
    return torch.float32
