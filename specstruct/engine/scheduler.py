"""The scheduler: one background thread owns the models; requests from any thread or asyncio task queue up.

    submit() ──> waiting (FIFO, at most max_queue) ──admit──> decoder rows (at most max_batch_size) ──step()──>
                 ▲                                                  │            tokens to each request's consumer
                 └── preempt: back to the front, KV spilled down ───┘

- An idle engine collects a burst of arrivals (each within GATHER_GAP_S of the last, for up to `timeout_ms`)
  before its first pass, so a lone request starts at once; then it admits in arrival order ("sequential"); a
  finished row's slot is refilled before the next step (continuous batching).
- Past `max_queue` waiting requests, `submit` raises OverloadedError at once.
- A consumer that goes away calls `Request.cancel()`; the row leaves before the next step and frees its slot.
- KV memory (`kv_memory.active_bytes`, all running rows together; engine/preempt.py): before admitting, the
  most recently admitted rows are paused while the running ones would not fit; a paused request waits at the
  front of the queue (new arrivals wait behind it) and resumes where it was once it fits. A request is admitted
  only when it fits next to the running rows (or runs alone).
- Tokens go to consumers through unbounded per-request queues, so a slow reader never blocks the loop.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from typing import Callable, Protocol, cast

from specstruct.config import BatchConfig, SpecConfig
from specstruct.constraints.base import Constraint
from specstruct.errors import EngineClosedError, OverloadedError, SpecStructError
from specstruct.spec.batch import BatchDecoder
from specstruct.spec.row import Row
from specstruct.spec.speculator import Speculator
from specstruct.runtime.openmp import release_pool
from specstruct.runtime.kv.memory import extra_headroom
from specstruct.engine.preempt import Pausable, Preemption, held
from specstruct.engine.request import Request


class RowDecoder(Protocol):
    """What the scheduler drives: the batch decoder (spec.batch.BatchDecoder), or a test's stand-in."""

    def add(self, row: Row) -> None: ...
    def remove(self, row: Row) -> None: ...
    def step(self) -> list[tuple[Row, list[int], bool]]: ...
    def __len__(self) -> int: ...


DecoderFactory = Callable[[Speculator], RowDecoder]
GATHER_GAP_S = 0.005  # an idle engine stops gathering a burst once no request arrived for this long
DEFAULT_DECODER: DecoderFactory = BatchDecoder


class Scheduler:
    """Queue, admission, cancellation and the decode loop for one engine."""

    def __init__(self, speculator: Speculator, config: BatchConfig | None = None, decoder: DecoderFactory | None = None,
                 *, preemption: Preemption | None = None):
        self.speculator, self.config = speculator, config or BatchConfig()
        self._factory = decoder or DEFAULT_DECODER
        self.decoder: RowDecoder | None = None
        self._cv = threading.Condition()
        self._waiting: deque[Request] = deque()
        self._active: dict[int, tuple[Row, Request]] = {}  # id(row) -> (row, request); loop thread only
        self._paused: dict[Request, Row] = {}  # paused requests (queued in _waiting) -> their rows
        self.preemption = preemption  # None: no KV budget across rows (a decoder without pause/resume)
        self._thread: threading.Thread | None = None
        self._closed: BaseException | None = None
        self.passes = 0  # decoder steps run (one target pass each with the batched decoder)

    # -- callers' side (any thread) ---------------------------------------------------------------------------
    def problem(self) -> str | None:
        """Why this scheduler can no longer serve (closed, or its loop thread died), or None: for health checks."""
        if self._closed is not None:
            return f"the engine's scheduler is closed ({self._closed!r})"
        if self._thread is not None and not self._thread.is_alive():
            return "the engine's decode loop thread has stopped"
        return None

    def submit(self, prompt: list[int], constraint: Constraint, config: SpecConfig, *,
               loop: asyncio.AbstractEventLoop | None = None) -> Request:
        """Queue a request; raises OverloadedError when max_queue requests are already waiting."""
        with self._cv:
            if self._closed is not None:
                raise EngineClosedError(f"the engine is closed ({self._closed}); build a new SpecStruct")
            self._check_room()
            req = Request(prompt, constraint, config, wake=self._wake, loop=loop)
            self._waiting.append(req)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="specstruct-scheduler", daemon=True)
                self._thread.start()
            self._cv.notify_all()
        release_pool()  # this thread's OpenMP pool, if it has one, would slow the decode thread (openmp.py)
        return req

    def check_room(self) -> None:
        """OverloadedError now if a request submitted now would get one (a server answers 429 before it starts a
        stream, whose status line would otherwise already be 200)."""
        with self._cv:
            self._check_room()

    def _check_room(self) -> None:
        # A request the loop will admit into a free slot is not queueing: max_queue counts those beyond the
        # slots (so max_batch_size + max_queue callers at once never overload, however late the loop admits).
        # Paused and cancelled requests hold no place (the loop drops cancelled ones before its next admission).
        # list() of the loop's dict is one atomic copy under the GIL.
        running = sum(1 for _, r in list(self._active.values()) if not r.cancelled)
        free = max(0, self.config.max_batch_size - running)
        waiting = sum(1 for r in self._waiting if not r.cancelled and r not in self._paused)
        if waiting >= self.config.max_queue + free:
            raise OverloadedError(
                f"{waiting} requests are already waiting for {free} free slots (BatchConfig.max_batch_size="
                f"{self.config.max_batch_size}, max_queue={self.config.max_queue}): retry later, raise "
                "max_queue, or send fewer requests at once")

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    @property
    def active(self) -> int:
        return len(self._active)

    @property
    def paused(self) -> int:
        return len(self._paused)

    def close(self, timeout: float | None = None) -> None:
        """Stop the loop: waiting requests fail with EngineClosedError, the running ones at the next step. Waits
        for the step under way (a long prefill takes seconds): at interpreter exit, a thread still inside torch
        would abort the process (`terminate called without an active exception`)."""
        with self._cv:
            if self._closed is None:
                self._closed = EngineClosedError("closed")
            self._cv.notify_all()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def _wake(self) -> None:
        with self._cv:
            self._cv.notify_all()

    # -- the loop (its own thread) -----------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            self.decoder = self._factory(self.speculator)
            if not hasattr(self.decoder, "pause"):
                self.preemption = None
            while self._admit():
                if len(self.decoder):
                    self._step()
            reason: BaseException = EngineClosedError("the engine was closed while this request ran")
        except BaseException as err:  # noqa: BLE001 - a bug in a step must fail the requests, never hang them
            reason = err if isinstance(err, SpecStructError) else SpecStructError(
                f"internal error in the decode loop: {err!r}; this is a bug in specstruct")
            reason.__cause__ = err
            with self._cv:
                self._closed = reason
        with self._cv:
            waiting, self._waiting = list(self._waiting), deque()
        for row, req in list(self._active.values()):
            self._drop(row, req, reason)
        if isinstance(reason, EngineClosedError):
            reason = EngineClosedError("the engine was closed before this request started")
        for req in waiting:
            self._end_waiting(req, reason if req not in self._paused else EngineClosedError(
                "the engine was closed while this request was paused"))

    def _admit(self) -> bool:
        """Wait for work, then admit waiting requests into free slots (arrival order). False once closed."""
        size = self.config.max_batch_size
        if not self._active:
            release_pool()  # idle: give the OpenMP workers back while other threads may compute (openmp.py)
        with self._cv:
            while self._closed is None and not self._waiting and not self._active:
                self._cv.wait()
            # an idle engine gathers a burst before its first pass: while requests keep arriving (each within
            # GATHER_GAP_S of the last), for up to timeout_ms; a lone request starts at once (paused ones too)
            if self._closed is None and not self._active and not self._paused and self.config.timeout_ms > 0:
                deadline = time.monotonic() + self.config.timeout_ms / 1000
                while self._closed is None and len(self._waiting) < size and (left := deadline - time.monotonic()) > 0:
                    arrived = len(self._waiting)
                    self._cv.wait(min(left, GATHER_GAP_S))
                    if len(self._waiting) == arrived:
                        break  # no one came within the gap: the burst is over
            if self._closed is not None:
                return False
        for row, req in list(self._active.values()):
            if req.cancelled:
                self._drop(row, req, None)
        self._make_room()  # before admission: a row resumed below is never paused again in the same step
        with self._cv:
            gone = [req for req in self._waiting if req.cancelled]  # now, not when a slot frees (spilled KV)
            if gone:
                self._waiting = deque(req for req in self._waiting if not req.cancelled)
            new: list[Request] = []
            running = [held(row) for row, _ in self._active.values()]
            while self._waiting and len(self._active) + len(new) < size:
                req = self._waiting[0]
                if not self._fits(running, self._held(req)):
                    break  # in order: nobody overtakes a paused request (or an older one) that does not fit yet
                running.append(self._held(req))
                new.append(self._waiting.popleft())
            head = self._paused.get(self._waiting[0]) if self._waiting else None
        for req in gone:
            self._end_waiting(req, None)
        for req in new:
            self._start(req)
        if head is not None and self.preemption is not None:
            self.preemption.prefetch(head)  # next in line: read its KV back while the others step
        return True

    def _decoder(self) -> RowDecoder:
        if self.decoder is None:
            raise RuntimeError("internal error: the scheduler's loop has no decoder yet")
        return self.decoder

    def _pausable(self) -> Pausable:
        """The decoder, which has pause and resume wherever preemption is on (_run turns it off otherwise)."""
        return cast(Pausable, self._decoder())

    def _preemption(self) -> Preemption:
        if self.preemption is None:
            raise RuntimeError("internal error: a request was paused without preemption")
        return self.preemption

    def _held(self, req: Request) -> int:
        row = self._paused.get(req)
        return held(row) if row is not None else len(req.prompt) + extra_headroom(
            req.config, req.constraint.mode)  # counted as its row will be, from admission on

    def _fits(self, running: list[int], tokens: int) -> bool:
        return self.preemption is None or self.preemption.fits(running, tokens)

    def _make_room(self) -> None:
        """Pause the most recently admitted rows while the running ones' KV would not fit the active tier."""
        if self.preemption is None:
            return
        for row in self.preemption.victims([row for row, _ in self._active.values()]):
            req = self._active[id(row)][1]
            try:
                self.preemption.pause(self._pausable(), row)
            except Exception as err:  # noqa: BLE001 - this request fails alone; never left in neither _active nor
                # _waiting (nobody would end it: its caller would wait forever), nor may it kill the loop
                error = SpecStructError(f"pausing this request to free KV memory failed ({err!r}); it was stopped "
                                        "(raise kv_memory.active_bytes, or check kv_memory.directory)")
                error.__cause__ = err
                self._drop(row, req, error)  # out of the decoder too, if pause failed before taking it out
                continue
            self._active.pop(id(row))
            with self._cv:
                self._paused[req] = row
                self._waiting.appendleft(req)  # victims come newest first: the queue keeps admission order

    def _start(self, req: Request) -> None:
        paused = self._paused.get(req)
        req.admitted()
        try:
            if paused is not None:
                self._preemption().resume(self._pausable(), paused)
                row = self._paused.pop(req)
            else:
                row = self.speculator.row(req.prompt, req.constraint, req.config)
                self._decoder().add(row)
        except Exception as err:  # noqa: BLE001 - this request fails alone, before it takes a slot
            self._end_waiting(req, err)
            return
        self._active[id(row)] = (row, req)

    def _end_waiting(self, req: Request, error: BaseException | None) -> None:
        """End a request that is not running: cancelled or failed in the queue, or the engine closed. A paused
        one frees its spilled KV and keeps its row (what it emitted, its stats)."""
        row = self._paused.pop(req, None)
        if row is None:
            req.end(error)
            return
        self._preemption().discard(row)
        self._drop(row, req, error)

    def _drop(self, row: Row, req: Request, error: BaseException | None) -> None:
        self._active.pop(id(row), None)
        try:
            self._decoder().remove(row)
        finally:
            req.end(error, row)

    def _step(self) -> None:
        results = self._decoder().step()
        self.passes += 1
        now = time.perf_counter()
        for row, tokens, finished in results:
            _, req = self._active.get(id(row), (None, None))
            if req is None:
                continue
            req.observe_pass(len(results), now)
            if tokens:
                req.emit(tokens)
            if finished:
                self._drop(row, req, row.error)
