"""Where a row's KV caches start and what they leave behind: the prefix cache's side of the batch decoder.

A row's target cache starts from the longest cached prefix of its prompt (exact: prefill results do not depend on
where a prefix ends under row-invariant numerics); once it has read its whole prompt the prompt's KV is offered to
the cache. The draft model's cache does the same where reusing it cannot change the output.
"""

from __future__ import annotations

from typing import Any, Callable, TypeVar

from specstruct.runtime.kv.prefix_cache import PrefixCache
from specstruct.spec.interfaces import Runtime, Sequence_
from specstruct.spec.proposers import draft_model
from specstruct.spec.row import Row
from specstruct.spec.speculator import Speculator

T = TypeVar("T")


class KVReuse:
    """The batch's KV starts and prefix-cache offers for one speculator (its target, its draft runtime if any)."""

    def __init__(self, speculator: Speculator, draft: Runtime | None):
        self.speculator, self._draft = speculator, draft

    def target(self, row: Row, ids: list[int]) -> tuple[Sequence_, int]:
        """(a new target KV sequence, its length): the longest cached prefix of `ids` when the prefix cache may
        serve the row (kv/; exact because prefill results do not depend on where a prefix ends), else empty."""
        rt, cache = self.speculator.target, self.speculator.prefix_cache
        if cache is None or not cache.enabled or not rt.reuses_prefixes or not row.config.use_prefix_cache:
            return rt.sequence(), 0
        return _from_cache(cache, rt, row, ids, lambda layers, n: (rt.sequence(layers, n), n))

    def draft(self, row: Row) -> draft_model.DraftState:
        """The row's draft cache: from the longest cached draft prefix of its prompt where reusing it cannot change
        the output: a greedy row (the draft only proposes; the target alone decides every token), or a draft whose
        numerics make a cached prefix bitwise a cold one. Else empty: the draft reads the prompt with the target."""
        draft, cache = self.draft_runtime(), self.speculator.prefix_cache
        if cache is None or not self.draft_reuses(row):
            return draft_model.DraftState(draft)
        return _from_cache(cache, draft, row, row.prompt[:-1],
                           lambda layers, n: draft_model.DraftState(draft, layers, row.prompt[:n]))

    def draft_runtime(self) -> Runtime:
        if self._draft is None:
            raise RuntimeError("internal error: a draft cache was asked for without a draft model")
        return self._draft

    def draft_reuses(self, row: Row) -> bool:
        cache, draft = self.speculator.prefix_cache, self.draft_runtime()
        return (cache is not None and cache.enabled and row.config.use_prefix_cache and draft.packed
                and (row.config.temperature <= 0 or draft.reuses_prefixes))

    def remember(self, row: Row) -> None:
        """Offer a just-prefilled prompt's KV (target, and draft where it read the whole prompt) to the prefix cache
        (it copies what it keeps)."""
        rt, cache = self.speculator.target, self.speculator.prefix_cache
        if cache is not None and cache.enabled and rt.reuses_prefixes and row.config.use_prefix_cache:
            cache.insert((rt.cache_key, row.config.cache_salt), row.prompt, row.target_kv.views())
        self.remember_draft(row)

    def remember_draft(self, row: Row) -> None:
        """Offer the row's draft KV of its prompt to the draft's prefix cache, once the draft has read it all."""
        d, cache = row.draft_kv, self.speculator.prefix_cache
        if d is not None and cache is not None and d.tokens[: len(row.prompt)] == row.prompt and self.draft_reuses(row):
            cache.insert((self.draft_runtime().cache_key, row.config.cache_salt), row.prompt, d.kv.views())


def _from_cache(cache: PrefixCache, rt: Runtime, row: Row, ids: list[int],
                build: Callable[[list[Any] | None, int], T]) -> T:
    """`build(layers, n)` from the longest prefix of `ids` in `rt`'s namespace of the prefix cache (n may be 0,
    layers then None). `build` must copy the layers: the cache's spans are free to move once the hit is released."""
    hit = cache.lookup((rt.cache_key, row.config.cache_salt), ids)
    try:
        return build(hit.layers if hit.tokens else None, hit.tokens)
    finally:
        hit.release()
