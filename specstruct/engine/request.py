"""One queued request as its caller sees it: the committed tokens as they come, then its Output.

The scheduler thread calls `emit` / `end`; the caller reads with `tokens()` (any thread, with a deadline) or
`atokens()` (an asyncio task). Going away is `cancel()`: the scheduler drops the row before its next step.
Only copies cross to the caller: token lists and, at the end, an immutable Output; the row stays on the engine.
"""

from __future__ import annotations

import asyncio
import copy
import queue
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, AsyncIterator, Callable, Iterator

from specstruct.errors import RequestCancelledError, RequestTimeoutError
from specstruct.results import Stats

if TYPE_CHECKING:
    from specstruct.config import SpecConfig
    from specstruct.constraints.base import Constraint
    from specstruct.spec.row import Row

_END = object()


@dataclass(frozen=True)
class Output:
    """A finished (or cancelled) request, made on the scheduler thread when its row ends: what it wrote, why it
    stopped, its stats, and whether its constraint took the output as a whole value. Nothing in it is shared
    with the engine (in the spirit of vLLM's EngineCoreOutput)."""

    token_ids: list[int]
    finish_reason: str  # "stop", "length" or "error"
    stats: Stats
    complete: bool  # the constraint is final and allows only the end there (constraints.base.finished)

    @classmethod
    def of(cls, row: Row) -> "Output":
        complete = row.complete()  # first: it may compute a mask, whose time the stats count
        return cls(list(row.token_ids), row.finish_reason, copy.deepcopy(row.stats), complete)


class Request:
    def __init__(self, prompt: list[int], constraint: Constraint, config: SpecConfig, *, wake: Callable[[], None],
                 loop: asyncio.AbstractEventLoop | None = None):
        self.prompt, self.constraint, self.config = prompt, constraint, config
        self.output: Output | None = None  # once finished with a row (None: failed or cancelled before one ran)
        self.error: BaseException | None = None
        self.cancelled = self.done = False
        self.submitted = time.perf_counter()
        self.queue_s: float | None = None
        self._rows = self._passes = 0
        self._wake, self._loop = wake, loop
        self._items: Any = asyncio.Queue() if loop is not None else queue.SimpleQueue()

    # -- scheduler side ---------------------------------------------------------------------------------------
    def admitted(self) -> None:
        """Given a slot: the wait in the queue ends here (the first pass, its prefill, is decoding time)."""
        if self.queue_s is None:
            self.queue_s = time.perf_counter() - self.submitted

    def observe_pass(self, rows: int, now: float) -> None:
        self._rows += rows
        self._passes += 1

    def emit(self, tokens: list[int]) -> None:
        self._put(tokens)

    def end(self, error: BaseException | None, row: Row | None = None) -> None:
        """Finished (error None), failed, or dropped after a cancel: the caller's Output is made here, on the
        scheduler thread, with the row's queue and batch stats."""
        if self.done:
            return
        if row is not None:
            row.stats.queue_s = self.queue_s or 0.0
            row.stats.batch_rows = self._rows / self._passes if self._passes else 0.0
            self.output = Output.of(row)
        self.error, self.done = error, True
        self._put(_END)

    def _put(self, item: Any) -> None:
        if self._loop is None:
            self._items.put(item)
            return
        try:
            self._loop.call_soon_threadsafe(self._items.put_nowait, item)
        except RuntimeError:  # the caller's event loop is closed: nobody is listening any more
            self.cancelled = True

    # -- caller side ------------------------------------------------------------------------------------------
    def cancel(self) -> None:
        """The caller went away: the row leaves at the next step (a no-op once finished)."""
        if not self.done and not self.cancelled:
            self.cancelled = True
            self._wake()

    def tokens(self, deadline: float | None = None) -> Iterator[list[int]]:
        """Committed tokens as they come (blocking); raises the row's error, or RequestTimeoutError at
        `deadline` (time.monotonic()), cancelling the request. A request that finished in time is read to the end
        however slowly its reader reads."""
        while True:
            timeout = None if deadline is None or self.done else deadline - time.monotonic()  # done: all queued
            try:
                if timeout is not None and timeout <= 0:
                    raise queue.Empty
                item = self._items.get(timeout=timeout)
            except queue.Empty:
                self.cancel()
                raise self._timeout() from None
            if item is _END:
                break
            yield item
        if self.error is not None:
            raise self.error

    async def atokens(self, deadline: float | None = None) -> AsyncIterator[list[int]]:
        """`tokens()` for an asyncio task (the request must have been submitted with this loop)."""
        while True:
            timeout = None if deadline is None or self.done else deadline - time.monotonic()
            try:
                if timeout is not None and timeout <= 0:
                    raise asyncio.TimeoutError
                item = await asyncio.wait_for(self._items.get(), timeout)
            except asyncio.TimeoutError:
                self.cancel()
                raise self._timeout() from None
            if item is _END:
                break
            yield item
        if self.error is not None:
            raise self.error

    def result(self, deadline: float | None = None) -> Output:
        """Block until finished; its Output (raises its error, or RequestTimeoutError at `deadline`)."""
        for _ in self.tokens(deadline):
            pass
        return self._output()

    async def aresult(self, deadline: float | None = None) -> Output:
        async for _ in self.atokens(deadline):
            pass
        return self._output()

    def _output(self) -> Output:
        if self.output is None:  # ended without an error and without a row: cancelled while it waited
            raise RequestCancelledError("the request was cancelled before it wrote anything (cancel() was called, "
                                        "or its reader went away); submit it again for a result")
        return self.output

    def _timeout(self) -> RequestTimeoutError:
        where = "waiting for a slot" if self.queue_s is None else "while decoding"
        return RequestTimeoutError(f"the request's timeout ran out {where} "
                                   f"({time.perf_counter() - self.submitted:.2f} s after submission); it was "
                                   "cancelled: raise timeout=, or lower max_new_tokens")
