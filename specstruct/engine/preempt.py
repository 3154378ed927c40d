"""Preemption: the active tier (`kv_memory.active_bytes`) holds the KV of every running row together.

Before each step the scheduler asks `victims` whom to pause: while the running rows' projected KV (the tokens
each holds, plus one verification pass of headroom, times the target + draft bytes per token) is over the budget
and more than one row runs, the most recently admitted row. `pause` takes it out of the batch and spills its
target and draft caches to the store (pinned host memory on a GPU, then disk; only its token ids when no tier has
room); the scheduler puts its request back at the front of the queue. When it fits again, `resume` restores the
caches (or, when a spill file was lost or never written, the batch prefills those tokens again: same KV, same
output). A row keeps everything else (constraint, drafters, generator, stats, emitted tokens) meanwhile.
"""

from __future__ import annotations

import time
from typing import Any, Protocol, Sequence

from specstruct.runtime.kv.layers import SeqKV
from specstruct.runtime.kv.memory import KVBudget, extra_headroom
from specstruct.runtime.kv.store import KVStore, SpillHandle
from specstruct.spec.row import Row


class Pausable(Protocol):
    """A decoder that can take a row out between steps and put it back (spec.batch.BatchDecoder)."""

    def pause(self, row: Row) -> tuple[SeqKV, SeqKV | None]: ...

    def resume(self, row: Row, target: SeqKV, draft: SeqKV | None) -> None: ...


def held(row: Row) -> int:
    """Tokens a row holds, as far as the budget counts: its prompt (whole, even while prefilling) and output, plus
    what one step of a row whose config allows more than the budget's default headroom (max_candidates above 16,
    up to 64) may add beyond that headroom, so the budget follows each request's own cap."""
    return len(row.prompt) + len(row.token_ids) + extra_headroom(row.config, row.constraint.mode)


class Preemption:
    """The active tier's budget over all running rows, and the spilled caches of paused rows."""

    def __init__(self, budget: KVBudget, store: KVStore):
        self.budget, self.store = budget, store
        self._spilled: dict[int, tuple[SpillHandle, SpillHandle | None]] = {}  # id(row) -> target, draft
        self._n = dict(preemptions=0, resumes=0, restored=0, reprefilled=0, spill_s=0.0, restore_s=0.0,
                       spilled_tokens=0)

    @property
    def enabled(self) -> bool:
        return bool(self.budget.active_bytes)

    def fits(self, running: Sequence[int], tokens: int) -> bool:
        """May a row holding `tokens` join rows holding `running` tokens each?"""
        limit = self.budget.active_bytes
        if not limit or not running:
            return True  # alone, a request always fits: KVBudget.check refused it before it started otherwise
        return sum(map(self.budget.need, running)) + self.budget.need(tokens) <= limit

    def victims(self, running: Sequence[Row]) -> list[Row]:
        """The rows to pause, most recently admitted first (`running` is in admission order); never the first."""
        limit = self.budget.active_bytes
        if not limit:
            return []
        total, out = sum(self.budget.need(held(r)) for r in running), []
        for row in reversed(running[1:]):
            if total <= limit:
                break
            out.append(row)
            total -= self.budget.need(held(row))
        return out

    def pause(self, decoder: Pausable, row: Row) -> None:
        """Take `row` out of `decoder` and spill its caches. A failed disk write is no error (the store keeps the
        token ids: re-prefilled on resume); if anything still raises, nothing stays spilled for the row and the
        caller must end its request (its KV may be gone from the decoder already)."""
        t0 = time.perf_counter()
        target, draft = decoder.pause(row)
        spilled = self.store.spill(target)
        try:
            second = None if draft is None else self.store.spill(draft)
        except BaseException:
            self.store.discard(spilled)  # else its bytes stay counted, recorded nowhere, until the engine closes
            raise
        self._spilled[id(row)] = (spilled, second)
        self._n["spill_s"] += time.perf_counter() - t0
        self._n["spilled_tokens"] += len(target.tokens)
        row.stats.preempted += 1
        self._n["preemptions"] += 1

    def prefetch(self, row: Row) -> None:
        """Start reading a paused row's caches back (it is next in line)."""
        for handle in self._spilled.get(id(row), ()):
            if handle is not None:
                self.store.prefetch(handle)

    def resume(self, decoder: Pausable, row: Row) -> None:
        """Put a paused row back into `decoder` (a lost spill warns with KVLostWarning and is prefilled again)."""
        t0 = time.perf_counter()
        target, draft = self._spilled.pop(id(row))
        seq = self.store.restore(target)
        decoder.resume(row, seq, None if draft is None else self.store.restore(draft))
        self._n["restore_s"] += time.perf_counter() - t0  # the waiting part: prefetch may have read it already
        self._n["resumes"] += 1
        self._n["restored" if seq.layers is not None or not seq.tokens else "reprefilled"] += 1

    def discard(self, row: Row) -> None:
        """Free a paused row's spilled caches (its request was cancelled or the engine closed)."""
        for handle in self._spilled.pop(id(row), ()):
            if handle is not None:
                self.store.discard(handle)

    def info(self) -> dict[str, Any]:
        return dict(self._n, paused=len(self._spilled), store=self.store.info())
