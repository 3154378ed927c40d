"""A user's Lark grammar keeps its llguidance matcher in a forked child, where a call that never returns can be ended.

llguidance 1.9.1 loops forever in some masks (two adjacent terminals of one repeated character: `start: A A` with
`A: /b+/`), allocating as it goes, and none of its limits stops it: with step_lexer_fuel=10_000,
max_lexer_states=2_000 and step_max_items=1_000 the first mask of `start: A A` still never returns, and its
forced-bytes walk holds the GIL. The probe (grammar_probe.py) refuses such a grammar when the loop sits near the
start; one behind a long terminal (`start: P A A` with `P: /[xy]{300}/`) is reached only while generating. So a
grammar the user wrote is compiled in a child (`compile_isolated`: under the compile limits `time_s` and
`memory_mb`, as llguidance's compile has no clock), its matcher lives there, the probe's walks run there, and every
call on it (mask, forced text, token steps, rollback, fork) is a message over a pipe, answered within `mask_time_s`.
Past it the child is killed, its memory with it, and the call raises ConstraintError naming the limit: that request
fails, the process and its other requests go on. The matcher and all its forks share one child, which dies with the
last of them. The child runs only llguidance and pickle (no threads, no imports after the fork) and ends itself with
SIGALRM if a call outlives the limit by 2 s, so not even a killed parent leaves it spinning.

Cost (tiny tokenizer, 2-core Xeon): one call is a pipe round trip of about 30-60 us, and a step makes 2-4 of them;
the fork costs a few ms per request (page tables of the parent). Grammars specstruct writes itself (the tool-call
grammar, grammar_probe.trust) and platforms without os.fork keep the matcher in-process.
"""

from __future__ import annotations

import itertools
import os
import pickle
import signal
import threading
import time
import weakref
from typing import Any, Callable

from specstruct.constraints.limits import limits, too_complex
from specstruct.constraints.llguidance.bounded import _HEADER, _read, _write, enter_child, failure, fork, reap
from specstruct.constraints.llguidance.walks import walk
from specstruct.errors import ConstraintError

def available() -> bool:
    return hasattr(os, "fork")


def isolate(matcher: Any) -> "RemoteMatcher":
    """`matcher` (an LLMatcher) moved into a new child process; the local object is left unused. A RemoteMatcher
    is returned as it is."""
    if isinstance(matcher, RemoteMatcher):
        return matcher
    channel = _Channel(lambda: matcher, "the grammar")
    return RemoteMatcher(channel, 0, channel.state)


def compile_isolated(build: Callable[[], Any], what: str) -> "RemoteMatcher":
    """The matcher `build()` returns, built in a new child process under the compile limits (`time_s`,
    `memory_mb`) and kept there; ConstraintError naming the limit it hit, or `build`'s own error."""
    channel = _Channel(build, what)
    return RemoteMatcher(channel, 0, channel.state)


def pid_of(matcher: Any) -> int | None:
    """The child holding `matcher` (a RemoteMatcher), None for one in this process."""
    return matcher._ch.pid if isinstance(matcher, RemoteMatcher) else None


class RemoteMatcher:
    """The LLMatcher methods GrammarConstraint uses, answered by the child. The state queries are answered from the
    state the child sends back with every reply (only a call can change it)."""

    def __init__(self, channel: "_Channel", handle: int, state: tuple[str, bool, bool]):
        self._ch, self._h, self._state = channel, handle, state

    def __del__(self) -> None:
        self._ch.drops.append(self._h)  # no lock, no I/O here: sent with the next call

    def _call(self, op: str, *args: Any) -> Any:
        result, self._state = self._ch.call(op, self._h, args)
        return result

    def is_error(self) -> bool:
        return bool(self._state[0])

    def get_error(self) -> str:
        return self._state[0]

    def is_stopped(self) -> bool:
        return self._state[1]

    def is_accepting(self) -> bool:
        return self._state[2]

    def compute_bitmask(self) -> bytes:
        return self._call("compute_bitmask")

    def compute_ff_bytes(self) -> bytes:
        return self._call("compute_ff_bytes")

    def validate_tokens(self, tokens: list[int]) -> int:
        return self._call("validate_tokens", list(tokens))

    def consume_token(self, token: int) -> bool:
        return self._call("consume_token", int(token))

    def rollback(self, n: int) -> bool:
        return self._call("rollback", int(n))

    def walk(self, vocab_size: int, lengths: Any, budget_s: float) -> bool:
        """The probe's random walks (walks.walk) on a copy, in the child; False when they did not finish
        within `budget_s` (the child is then killed, and this matcher with it)."""
        try:
            self._ch.call("walk", self._h, (vocab_size, lengths), budget_s)
        except TimeoutError:
            return False
        return True

    def deep_copy(self) -> "RemoteMatcher":
        handle = next(self._ch.handles)
        self._call("deep_copy", handle)
        return RemoteMatcher(self._ch, handle, self._state)


class _Channel:
    """One child and the two pipes to it; calls are serialised (forks of one request's matcher share it)."""

    def __init__(self, build: Callable[[], Any], what: str):
        from_parent, to_child = os.pipe()
        from_child, to_parent = os.pipe()
        lim = limits()
        pid = fork()
        if pid == 0:  # the child: never returns
            code = 0
            try:
                enter_child((from_parent, to_parent), lim.memory_mb << 20, lim.time_s)
                try:
                    matcher = build()
                except BaseException as e:  # noqa: BLE001 - a Rust panic is a BaseException: reported, not raised
                    _reply(to_parent, False, failure(what, e), ("", False, False))
                    os._exit(0)
                signal.alarm(0)
                _reply(to_parent, True, None, _state(matcher))
                _serve(matcher, from_parent, to_parent)
            except BaseException:  # noqa: BLE001 - the parent sees EOF and names the crash
                code = 1
            os._exit(code)
        os.close(from_parent)
        os.close(to_parent)
        self.pid, self.out, self.inp = pid, to_child, from_child
        self.handles = itertools.count(1)
        self.drops: list[int] = []
        self.error: ConstraintError | None = None
        self.lock = threading.Lock()
        self._finalizer = weakref.finalize(self, _end, pid, to_child, from_child)
        try:  # the build: under the compile limits, as every compile (bounded.py)
            ok, result, self.state = pickle.loads(_read(self.inp, time.monotonic() + lim.time_s))
        except TimeoutError:
            self._finalizer()
            raise too_complex(what, "time_s", f"compiling it ran past {lim.time_s:g} s and was stopped") from None
        except (OSError, EOFError, pickle.UnpicklingError):
            status = self._status()
            self._finalizer()
            raise too_complex(what, "memory_mb", f"compiling it needed more memory than the limit, or crashed (the "
                              f"child process {status}), and was stopped") from None
        except BaseException:  # interrupted (Ctrl-C): no child left compiling
            self._finalizer()
            raise
        if not ok:
            self._finalizer()
            raise result

    def call(self, op: str, handle: int, args: tuple,
             budget: float | None = None) -> tuple[Any, tuple[str, bool, bool]]:
        """`op` on matcher `handle`, answered within `budget` (default `mask_time_s`). Past it the child is killed
        and ConstraintError raised (TimeoutError when `budget` was given: the caller names the limit)."""
        given = budget is not None
        with self.lock:
            if self.error is not None:
                raise self.error
            drops, self.drops = self.drops, []
            budget = limits().mask_time_s if budget is None else budget
            message = pickle.dumps((drops, op, handle, args, budget), protocol=pickle.HIGHEST_PROTOCOL)
            try:
                _write(self.out, _HEADER.pack(len(message)) + message)
                ok, result, state = pickle.loads(_read(self.inp, time.monotonic() + budget))
            except TimeoutError:
                if given:
                    self.error = ConstraintError("the grammar's matcher was stopped: it did not answer in time")
                    self._finalizer()
                    raise
                self._fail(ConstraintError(
                    f"the grammar's matcher did not answer within {budget:g} s while generating (llguidance's "
                    f"{op}): llguidance loops on some grammars, e.g. two adjacent terminals of one repeated "
                    "character (`start: A A` with `A: /b+/`): put a literal between them or merge them into one "
                    f"terminal. It exceeds the {limits().describe('mask_time_s')}"))
            except (OSError, EOFError, pickle.UnpicklingError):
                self._fail(ConstraintError(f"llguidance crashed on this grammar while generating ({op}; the "
                                           f"child process {self._status()}); simplify the grammar"))
            except BaseException:  # interrupted mid-call (Ctrl-C): its answer would be read as the next call's
                self.error = ConstraintError("the grammar's matcher was interrupted mid-call and stopped")
                self._finalizer()
                raise
        if not ok:
            raise result
        return result, state

    def _fail(self, error: ConstraintError) -> None:
        self.error = error
        self._finalizer()  # killed and reaped now: its CPU and memory come back at once
        raise error

    def _status(self) -> str:
        try:
            done, status = os.waitpid(self.pid, os.WNOHANG)
        except ChildProcessError:
            return "ended"
        if done and os.WIFSIGNALED(status):
            return f"died of signal {os.WTERMSIG(status)}"
        return f"exited with {os.WEXITSTATUS(status)}" if done else "stopped answering"


def _end(pid: int, out: int, inp: int) -> None:
    for fd in (out, inp):
        try:
            os.close(fd)
        except OSError:
            pass
    reap(pid)


def _state(m: Any) -> tuple[str, bool, bool]:
    return (m.get_error() if m.is_error() else "", m.is_stopped(), m.is_accepting())


def _reply(out: int, ok: bool, result: Any, state: tuple[str, bool, bool]) -> None:
    reply = pickle.dumps((ok, result, state), protocol=pickle.HIGHEST_PROTOCOL)
    _write(out, _HEADER.pack(len(reply)) + reply)


def _serve(matcher: Any, inp: int, out: int) -> None:
    """The child's loop: one call per message until the parent closes the pipe."""
    matchers = {0: matcher}
    while True:
        try:
            drops, op, handle, args, budget = pickle.loads(_read(inp, None))
        except EOFError:
            return
        for h in drops:
            matchers.pop(h, None)
        m = matchers[handle]
        signal.alarm(int(budget) + 2)  # a loop outlives the parent's wait: ends itself even if nobody kills it
        try:
            if op == "deep_copy":
                matchers[args[0]] = m.deep_copy()
                ok, result = True, None
            elif op == "walk":
                ok, result = True, walk(m, *args)
            else:
                ok, result = True, getattr(m, op)(*args)
        except Exception as e:  # noqa: BLE001 - raised again in the parent, as in-process
            ok, result = False, e if _picklable(e) else RuntimeError(f"{type(e).__name__}: {e}")
        signal.alarm(0)
        _reply(out, ok, result, _state(m))


def _picklable(e: BaseException) -> bool:
    try:
        pickle.loads(pickle.dumps(e))
        return True
    except Exception:  # noqa: BLE001
        return False
