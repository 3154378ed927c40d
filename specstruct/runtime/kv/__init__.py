"""KV memory: reuse of cached prompt prefixes, and tiers for KV that is not in use.

    layers        a sequence's KV as per-layer (key, value) tensors [1, kv_heads, length, head_dim]; byte sizes
    radix         radix tree over token ids with lock counts and LRU order
    tiers         byte-budgeted storage: memory (RAM / GPU) and disk (safetensors, checksummed)
    pinned        GPU -> pinned host memory on a side CUDA stream
    prefix_cache  the prefix cache: lookup / insert / prefetch across tiers, per namespace (model, numerics, salt)
    store         spill / restore of whole sequences (for preemption by the scheduler)
    memory        building the tiers from EngineConfig, and the active-tier budget (all running requests)
"""

from specstruct.runtime.kv.layers import KVLayers, SeqKV, bytes_per_token
from specstruct.runtime.kv.prefix_cache import KVLostWarning, PrefixCache, PrefixHit
from specstruct.runtime.kv.store import KVStore, SpillHandle

__all__ = ["KVLayers", "KVLostWarning", "KVStore", "PrefixCache", "PrefixHit", "SeqKV", "SpillHandle",
           "bytes_per_token"]
