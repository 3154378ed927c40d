"""Prefix (attention) cache: KV of earlier prompts, keyed by token ids in one radix tree per namespace (model role,
numerics and tenant salt), bounded in bytes per tier. When the resident tier is over budget the least recently used
span that no request holds moves to the next tier (disk on CPU, pinned host memory on a GPU) or, from the last
tier, is dropped. Thread-safe; disk reads run outside the lock while the nodes they read are locked."""

from __future__ import annotations

import threading
import warnings
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Hashable, Sequence

from specstruct.runtime.openmp import releasing
from specstruct.runtime.kv.layers import KVLayers, concat, span
from specstruct.runtime.kv.radix import Node, RadixTree
from specstruct.runtime.kv.tiers import Slot, Tier

LOST = "lost"  # payload of a span whose spill file was missing or corrupted


class KVLostWarning(RuntimeWarning):
    """Spilled KV could not be read back: those tokens are prefilled again (the output is unaffected)."""


@dataclass
class Block:
    tier: int
    slot: Slot
    loading: Future[KVLayers | None] | None = None


class PrefixHit:
    """The KV of the first `tokens` ids (fresh tensors: the caller may keep them). The nodes stay locked (never
    moved, dropped or split) until `release()`."""

    def __init__(self, cache: "PrefixCache | None", tree: RadixTree | None, node: Node | None, tokens: int,
                 layers: KVLayers):
        self._cache, self._tree, self._node = cache, tree, node
        self.tokens, self.layers = tokens, layers

    def release(self) -> None:
        if self._node is not None and self._cache is not None and self._tree is not None:
            self._cache._unlock(self._tree, self._node)
            self._node = None


class PrefixCache:
    def __init__(self, tiers: Sequence[Tier]):
        self.tiers = list(tiers)  # tiers[0] is resident; each later one is cheaper and slower
        self._trees: dict[Hashable, RadixTree] = {}
        self._lock = threading.RLock()
        self._pool: ThreadPoolExecutor | None = None
        self._failed: set[str] = set()  # lower tiers whose writes failed (warned once)
        self._n = dict(lookups=0, hits=0, queried_tokens=0, cached_tokens=0, inserted_tokens=0, spills=0,
                       restores=0, evictions=0, lost=0)

    @property
    def enabled(self) -> bool:
        return bool(self.tiers) and self.tiers[0].budget > 0

    # -- lookup -----------------------------------------------------------------------------------------------
    def lookup(self, namespace: Hashable, ids: Sequence[int], *, align: int = 1) -> PrefixHit:
        """The longest cached prefix of `ids`, cut down to a multiple of `align` tokens."""
        with self._lock:
            self._n["lookups"] += 1
            self._n["queried_tokens"] += len(ids)
            tree = self._trees.get(namespace)
            path = tree.match(ids, usable=lambda n: n.payload is not LOST) if tree else []
            want = sum(k for _, k in path) // align * align
            take, left = [], want
            for node, k in path:
                if left <= 0:
                    break
                take.append((node, min(k, left)))
                left -= k
            if not take:
                return PrefixHit(None, None, None, 0, [])
            assert tree is not None  # a path was found in it
            tree.touch([n for n, _ in path])
            tree.lock(take[-1][0])
        hit = PrefixHit(self, tree, take[-1][0], 0, [])
        parts, got = [], 0
        for node, k in take:
            layers = self._resident(node)
            if layers is None:
                break
            parts.append([(a[:, :, :k], b[:, :, :k]) for a, b in layers])
            got += k
        usable = got // align * align
        hit.layers = concat(parts) if usable else []
        if 0 < usable < got:
            hit.layers = span(hit.layers, 0, usable)
        hit.tokens = usable
        with self._lock:
            self._n["hits"] += bool(usable)
            self._n["cached_tokens"] += usable
            self._enforce()
        if not usable:
            hit.release()
        return hit

    def prefetch(self, namespace: Hashable, ids: Sequence[int]) -> Future[int]:
        """Bring the spans of the longest cached prefix of `ids` back to the resident tier, on a background thread
        (call it when a request is next in line). A later lookup waits for a load in flight."""
        with self._lock:
            tree = self._trees.get(namespace)
            path = tree.match(ids, usable=lambda n: n.payload is not LOST) if tree else []
            if not path:
                done: Future[int] = Future()
                done.set_result(0)
                return done
            assert tree is not None  # a path was found in it
            tree.lock(path[-1][0])
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="specstruct-kv-prefetch")

        def job() -> int:
            try:
                return sum(1 for n, _ in path if self._resident(n) is not None)
            finally:
                self._unlock(tree, path[-1][0])

        return self._pool.submit(releasing(job))

    def _resident(self, node: Node) -> KVLayers | None:
        """The node's layers in the resident tier, read back from a lower tier if needed (the node is locked).
        None when they are lost: the node is marked and a KVLostWarning issued."""
        with self._lock:
            if node.payload is LOST:
                return None
            block: Block = node.payload
            if block.tier == 0:
                return self.tiers[0].get(block.slot)
            owner = block.loading is None
            if owner:
                block.loading = Future()
            waiting = block.loading
            assert waiting is not None
        if not owner:
            return waiting.result()
        layers = self.tiers[block.tier].get(block.slot)  # outside the lock: a disk read
        with self._lock:
            self.tiers[block.tier].free(block.slot)
            if layers is None:
                node.payload = LOST
                self._n["lost"] += 1
                warnings.warn(f"a spilled KV span of {len(node.tokens)} tokens was missing or corrupted: those "
                              "tokens are prefilled again (the output is unaffected)", KVLostWarning, stacklevel=3)
            else:
                node.payload = Block(0, self.tiers[0].put(layers))
                layers = self.tiers[0].get(node.payload.slot)
                self._n["restores"] += 1
        waiting.set_result(layers)
        return layers

    def _unlock(self, tree: RadixTree, node: Node) -> None:
        with self._lock:
            tree.lock(node, -1)
            self._enforce()

    # -- insert and budgets -------------------------------------------------------------------------------------
    def insert(self, namespace: Hashable, ids: Sequence[int], layers: KVLayers) -> None:
        """Cache `ids` whose KV is `layers` (at least len(ids) positions; only what is new is copied)."""
        if not self.enabled or not ids:
            return
        with self._lock:
            tree = self._trees.setdefault(namespace, RadixTree())
            path = tree.match(ids)
            if path and path[-1][1] < len(path[-1][0].tokens) and path[-1][0].locks:
                return  # a span being read by a lookup is not split under it; the next request inserts this
            def new(start: int, end: int) -> Block:
                return Block(0, self.tiers[0].put(span(layers, start, end)))

            nodes = tree.insert(ids, self._split, new)
            offset = 0
            for node in nodes:
                if node.payload is LOST:  # recomputed just now: store it again
                    node.payload = new(offset, offset + len(node.tokens))
                offset += len(node.tokens)
            self._n["inserted_tokens"] += len(ids) - sum(k for _, k in path)
            self._enforce()

    def _split(self, block: Any, at: int) -> tuple[Any, Any]:
        if block is LOST:
            return LOST, LOST
        layers = self.tiers[block.tier].get(block.slot)
        self.tiers[block.tier].free(block.slot)
        if layers is None:
            return LOST, LOST
        n = int(layers[0][0].shape[-2])
        put = self.tiers[0].put
        return Block(0, put(span(layers, 0, at))), Block(0, put(span(layers, at, n)))

    def _enforce(self) -> None:
        for i, tier in enumerate(self.tiers):
            while tier.used > tier.budget:
                victim = self._lru(i)
                if victim is None:
                    break  # everything here is in use: over budget until released
                tree, node = victim
                lower = self.tiers[i + 1] if i + 1 < len(self.tiers) else None
                if lower is not None and node.payload.slot.nbytes <= lower.budget and self._move(node, i, lower):
                    self._n["spills"] += 1
                else:
                    self._drop(tree, node)

    def _move(self, node: Node, i: int, lower: Tier) -> bool:
        """Move a node's span from tier `i` down to `lower`; False (the span unchanged) when the write fails."""
        slot = node.payload.slot
        try:
            layers = self.tiers[i].get(slot)
            if layers is None:
                return False
            moved = lower.put(layers)
        except Exception as err:  # noqa: BLE001 - a full, unwritable or deleted spill folder (safetensors raises
            # SafetensorError, not OSError): the caller drops the span. It is only a cache; a request must not fail
            if lower.name not in self._failed:  # once per tier: a broken disk would otherwise warn at every eviction
                self._failed.add(lower.name)
                warnings.warn(f"prefix-cache KV could not be moved to the {lower.name} tier ({err}): such spans are "
                              "dropped from the cache instead (their tokens are prefilled again)", KVLostWarning,
                              stacklevel=4)
            return False
        # the upper slot is freed only once the copy exists: freed first, a failed put left the node holding a freed
        # slot that _drop / clear() freed again (negative bytes)
        self.tiers[i].free(slot)
        node.payload = Block(i + 1, moved)
        return True

    def _lru(self, tier: int) -> tuple[RadixTree, Node] | None:
        best, key = None, None
        for tree in self._trees.values():
            for node in tree.nodes():
                b = node.payload
                if node.locks or not isinstance(b, Block) or b.tier != tier or b.loading is not None:
                    continue
                k = (node.last_used, -node.depth)
                if key is None or k < key:
                    best, key = (tree, node), k
        return best

    def _drop(self, tree: RadixTree, node: Node) -> None:
        for n in tree.remove(node):
            if isinstance(n.payload, Block):
                self.tiers[n.payload.tier].free(n.payload.slot)
            n.payload = LOST
        self._n["evictions"] += 1

    # -- reporting ----------------------------------------------------------------------------------------------
    def info(self) -> dict[str, Any]:
        with self._lock:
            n = dict(self._n)
            entries = sum(1 for t in self._trees.values() for _ in t.nodes())
        return dict(enabled=self.enabled, **n, entries=entries,
                    hit_rate=n["hits"] / n["lookups"] if n["lookups"] else 0.0,
                    token_hit_rate=n["cached_tokens"] / n["queried_tokens"] if n["queried_tokens"] else 0.0,
                    bytes={t.name: t.used for t in self.tiers}, budgets={t.name: t.budget for t in self.tiers})

    def clear(self) -> None:
        """Drop every span no request holds."""
        with self._lock:
            for tree in self._trees.values():
                for child in list(tree.root.children.values()):
                    if not child.locks:
                        self._drop(tree, child)

    def close(self) -> None:
        self.clear()
        if self._pool is not None:
            self._pool.shutdown(wait=True)
        for t in self.tiers:
            t.close()
