"""Run one llguidance compile in a forked child, bounded by the compile limits (`time_s`, `memory_mb`), so that no
grammar or schema holds or takes down the process that asked for it.

llguidance's compile has no clock: a 200,000-alternative Lark grammar validated for about four minutes (the work
grows with the square of the alternatives), then panicked (`grammar.symbols.len() < u16::MAX`), and a schema's
Python rewrites are not bounded by its fuel either. `run_bounded(fn)` forks, runs `fn()` in the child under an
address-space limit (RLIMIT_AS: `memory_mb` more than the child starts with) and answers with its result, or kills
the child at `time_s` and raises ConstraintError naming that limit. An error in the child comes back as a
ConstraintError: its own, or (a Rust panic, any other exception) one saying what failed in a line, never a
backtrace. Without os.fork (Windows) `fn()` runs in-process, unbounded.
"""

from __future__ import annotations

import os
import pickle
import resource
import select
import signal
import struct
import threading
import time
import warnings
from typing import Any, Callable, TypeVar

from specstruct.constraints.limits import limits, too_complex
from specstruct.errors import ConstraintError

_PANICS = {  # words of an llguidance panic -> what it means, in the words of a fix
    "symbols.len() < u16::MAX": "it has more rules, terminals and alternatives than llguidance can number (65,535 "
                                "grammar symbols)"}
_HEADER = struct.Struct(">I")  # a message over a pipe to or from a child: its length, then its pickle
T = TypeVar("T")


def available() -> bool:
    return hasattr(os, "fork")


def panic(what: str, message: str) -> ConstraintError | None:
    """The ConstraintError for an llguidance error message that reports a Rust panic (llguidance returns some as
    error text, `panic: ...` and a backtrace), naming the limit it hit where known; None for any other message."""
    for words, meaning in _PANICS.items():
        if words in message:
            return ConstraintError(f"{what} cannot be compiled: {meaning}. Simplify it (fewer alternatives: a regex "
                                   "terminal such as /w[0-9]+x/ instead of listing every word).")
    if message.lstrip().startswith("panic") or "<backtrace>" in message or "stack backtrace" in message:
        first = " ".join(message.split("<backtrace>")[0].split("stack backtrace")[0].split())[:300]
        return ConstraintError(f"llguidance failed on {what} (an internal error: {first}); simplify it")
    return None


def failure(what: str, error: BaseException) -> ConstraintError:
    """`error` raised by a compile of `what`, as the ConstraintError the caller gets (one line, no backtrace)."""
    if isinstance(error, ConstraintError):
        return error
    message = " ".join(str(error).split())[:300]
    if known := panic(what, str(error)):
        return known
    if type(error).__name__ == "PanicException":
        return ConstraintError(f"llguidance failed on {what} (an internal error: {message}); simplify it")
    if isinstance(error, MemoryError):
        return too_complex(what, "memory_mb", "compiling it ran out of memory")
    return ConstraintError(f"{what} cannot be compiled: {type(error).__name__}: {message}")


def enter_child(keep: tuple[int, ...], memory_bytes: int, budget_s: float) -> None:
    """In a just-forked child: default signal handlers, no descriptor but `keep` (a client's connection must close
    with the server), at most `memory_bytes` more address space, and SIGALRM `budget_s` + 2 s from now (it ends by
    itself should nobody kill it)."""
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGALRM):  # the server's handlers are Python code
        signal.signal(sig, signal.SIG_DFL)
    last = 3
    for fd in sorted(keep):
        os.closerange(last, fd)
        last = fd + 1
    os.closerange(last, 1 << 16)
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    with open("/proc/self/statm") as f:
        size = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    if hard == resource.RLIM_INFINITY or size + memory_bytes < hard:
        resource.setrlimit(resource.RLIMIT_AS, (size + memory_bytes, hard))
    signal.alarm(int(budget_s) + 2)


# Held by every llguidance compile in this process, and by fork(): a child forked while another thread is inside
# llguidance's compile inherits the locks that thread holds, and hangs on the first of them (about 1 compile in 100
# with six threads compiling schemas). Compiles in children and calls on matchers do not take it.
COMPILING = threading.Lock()


def fork() -> int:
    with COMPILING, warnings.catch_warnings():  # Python 3.12+ warns about fork() with threads running: the child
        warnings.simplefilter("ignore", DeprecationWarning)  # runs only llguidance, numpy and pickle, and _exits
        return os.fork()


def run_bounded(fn: Callable[[], Any], what: str) -> Any:
    """`fn()` (returning something picklable) in a forked child under `time_s` and `memory_mb`; its result, or
    ConstraintError naming the limit it hit or what failed."""
    if not available():
        return fn()
    lim = limits()
    inp, out = os.pipe()
    try:
        pid = fork()
    except OSError:  # no memory to fork (strict overcommit): in-process, as without fork()
        os.close(inp)
        os.close(out)
        return fn()
    if pid == 0:  # the child: never returns
        try:
            enter_child((out,), lim.memory_mb << 20, lim.time_s)
            try:
                reply = (True, fn())
            except BaseException as e:  # noqa: BLE001 - a Rust panic is a BaseException: reported, never raised
                reply = (False, failure(what, e))
            data = pickle.dumps(reply, protocol=pickle.HIGHEST_PROTOCOL)
            _write(out, _HEADER.pack(len(data)) + data)
        finally:
            os._exit(0)
    os.close(out)
    try:
        ok, result = pickle.loads(_read(inp, time.monotonic() + lim.time_s))
    except TimeoutError:
        raise too_complex(what, "time_s", f"compiling it ran past {lim.time_s:g} s and was stopped") from None
    except (OSError, EOFError, pickle.UnpicklingError):
        raise too_complex(what, "memory_mb", "compiling it needed more memory than the limit, or crashed, and was "
                          "stopped") from None
    finally:
        os.close(inp)
        reap(pid)
    if not ok:
        raise result
    return result


def compile_here(build: Callable[[], T], what: str) -> T:
    """`build()` in this process, once a trial of it in a child (`run_bounded`) finished within the compile limits:
    for a compile whose result must live here (an LLMatcher the engine calls directly, which cannot be pickled).
    The trial's result is dropped; the compile here runs under COMPILING. Without os.fork, only the compile here."""
    if available():
        run_bounded(lambda: _dropped(build()), what)
    with COMPILING:
        return build()


def _dropped(_: object) -> None:
    return None


def reap(pid: int) -> None:
    """Kill child `pid` (if it still runs) and wait for it."""
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
