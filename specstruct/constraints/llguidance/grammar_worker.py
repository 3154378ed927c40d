"""A user's Lark grammar keeps its llguidance matcher in a forked child, where a call that never returns can be ended.

llguidance 1.9.1 loops forever in some masks (two adjacent terminals of one repeated character: `start: A A` with
`A: /b+/`), allocating as it goes, and none of its limits stops it: with step_lexer_fuel=10_000,
max_lexer_states=2_000 and step_max_items=1_000 the first mask of `start: A A` still never returns, and its
forced-bytes walk holds the GIL. The probe (grammar_probe.py) refuses such a grammar when the loop sits near the
start; one behind a long terminal (`start: P A A` with `P: /[xy]{300}/`) is reached only while generating. So the
matcher of a grammar the user wrote lives in a child forked right after it is compiled, and every call on it (mask,
forced text, token steps, rollback, fork) is a message over a pipe, answered within `mask_time_s`. Past it the child
is killed, its memory with it, and the call raises ConstraintError naming the limit: that request fails, the
process and its other requests go on. The matcher and all its forks share one child, which dies with the last of
them. The child runs only llguidance and pickle (no threads, no imports after the fork) and ends itself with
SIGALRM if a call outlives the limit by 2 s, so not even a killed parent leaves it spinning.

Cost (tiny tokenizer, 2-core Xeon): one call is a pipe round trip of about 30-60 us, and a step makes 2-4 of them;
the fork costs a few ms per request (page tables of the parent). Grammars specstruct writes itself (the tool-call
grammar, grammar_probe.trust) and platforms without os.fork keep the matcher in-process.
"""

from __future__ import annotations

import itertools
import os
import pickle
import resource
import select
import signal
import struct
import threading
import time
import weakref
from typing import Any

from specstruct.constraints.limits import limits
from specstruct.errors import ConstraintError

_HEADER = struct.Struct(">I")


def available() -> bool:
    return hasattr(os, "fork")


def isolate(matcher: Any) -> "RemoteMatcher":
    """`matcher` (an LLMatcher) moved into a new child process; the local object is left unused."""
    state = (matcher.get_error() if matcher.is_error() else "", matcher.is_stopped(), matcher.is_accepting())
    return RemoteMatcher(_Channel(matcher), 0, state)


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

    def deep_copy(self) -> "RemoteMatcher":
        handle = next(self._ch.handles)
        self._call("deep_copy", handle)
        return RemoteMatcher(self._ch, handle, self._state)


class _Channel:
    """One child and the two pipes to it; calls are serialised (forks of one request's matcher share it)."""

    def __init__(self, matcher: Any):
        from_parent, to_child = os.pipe()
        from_child, to_parent = os.pipe()
        budget = limits().mask_time_s
        memory = limits().memory_mb << 20
        pid = os.fork()
        if pid == 0:  # the child: never returns
            code = 0
            try:
                os.close(to_child)
                os.close(from_child)
                _serve(matcher, from_parent, to_parent, budget, memory)
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

    def call(self, op: str, handle: int, args: tuple) -> tuple[Any, tuple[str, bool, bool]]:
        with self.lock:
            if self.error is not None:
                raise self.error
            drops, self.drops = self.drops, []
            budget = limits().mask_time_s
            message = pickle.dumps((drops, op, handle, args, budget), protocol=pickle.HIGHEST_PROTOCOL)
            try:
                _write(self.out, _HEADER.pack(len(message)) + message)
                ok, result, state = pickle.loads(_read(self.inp, time.monotonic() + budget))
            except TimeoutError:
                self._fail(ConstraintError(
                    f"the grammar's matcher did not answer within {budget:g} s while generating (llguidance's "
                    f"{op}): llguidance loops on some grammars, e.g. two adjacent terminals of one repeated "
                    "character (`start: A A` with `A: /b+/`): put a literal between them or merge them into one "
                    f"terminal. It exceeds the {limits().describe('mask_time_s')}"))
            except (OSError, EOFError, pickle.UnpicklingError):
                self._fail(ConstraintError(f"llguidance crashed on this grammar while generating ({op}; the "
                                           f"child process {self._status()}); simplify the grammar"))
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
    try:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    except (ProcessLookupError, ChildProcessError):
        pass


def _write(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _read(fd: int, deadline: float | None) -> bytes:
    """One message: its 4-byte length, then the pickle. EOFError if the other side is gone, TimeoutError past
    `deadline` (None: wait for ever)."""
    buf, need, header = bytearray(), _HEADER.size, True
    while True:
        while len(buf) < need:
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0 or not select.select([fd], [], [], left)[0]:
                    raise TimeoutError
            chunk = os.read(fd, need - len(buf))
            if not chunk:
                raise EOFError
            buf += chunk
        if not header:
            return bytes(buf[_HEADER.size:])
        header, need = False, _HEADER.size + _HEADER.unpack(buf[:_HEADER.size])[0]


def _serve(matcher: Any, inp: int, out: int, budget: float, memory: int) -> None:
    """The child's loop: one call per message until the parent closes the pipe."""
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGALRM):  # the server's handlers are Python code
        signal.signal(sig, signal.SIG_DFL)
    keep = sorted({inp, out})
    os.closerange(3, keep[0])  # the server's sockets and files: a client's connection must close with the server
    os.closerange(keep[0] + 1, keep[-1])
    os.closerange(keep[-1] + 1, 1 << 16)
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    with open("/proc/self/statm") as f:
        size = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    if hard == resource.RLIM_INFINITY or size + memory < hard:
        resource.setrlimit(resource.RLIMIT_AS, (size + memory, hard))
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
            else:
                ok, result = True, getattr(m, op)(*args)
        except Exception as e:  # noqa: BLE001 - raised again in the parent, as in-process
            ok, result = False, e if _picklable(e) else RuntimeError(f"{type(e).__name__}: {e}")
        state = (m.get_error() if m.is_error() else "", m.is_stopped(), m.is_accepting())
        signal.alarm(0)
        reply = pickle.dumps((ok, result, state), protocol=pickle.HIGHEST_PROTOCOL)
        _write(out, _HEADER.pack(len(reply)) + reply)


def _picklable(e: BaseException) -> bool:
    try:
        pickle.loads(pickle.dumps(e))
        return True
    except Exception:  # noqa: BLE001
        return False
