"""Walk a new Lark grammar in a forked child first, because llguidance can loop forever on some grammars.

llguidance 1.9.1 never returns from a mask of some small grammars (two adjacent terminals of one repeated
character, e.g. `start: A A` with `A: /b+/`, or `A B` with `A: /a+/`, `B: /a/`): no fuel limit stops it, memory
grows, and the call holds the GIL, so the whole process (every other request of a server) freezes. A user's grammar
therefore first runs a few random walks (masks, forced text, random allowed tokens) in a forked child under a time
limit; a child that does not finish is killed and the grammar is refused as too complex. The walks cannot prove a
grammar safe (a loop deep in a long grammar may not be reached), but they catch the loop wherever it sits near the
start, which is where the known cases put it. A matcher already in its own child (grammar_worker) is walked in that
child. Grammars that passed are remembered (per tokenizer, by digest), so a grammar is probed once per process. Without os.fork (Windows) nothing is probed.
"""

from __future__ import annotations

import hashlib
import os
import signal
import threading
import time
import warnings
from typing import Any

import numpy as np

from specstruct.constraints.limits import limits, too_complex
from specstruct.constraints.llguidance.grammar_worker import RemoteMatcher
from specstruct.constraints.llguidance.walks import walk
from specstruct.errors import ConstraintError

# Grammars are remembered by their SHA-256 digests (of the tokenizer key and the source), never by their text: a
# grammar may be megabytes, and each table below costs at most its count of entries x about 200 bytes.
_PASSED: dict[bytes, None] = {}  # probed grammars; insertion-ordered, bounded
# looping grammars -> (budget, when, message): refused again at once for a while (a load spike could have caused it)
_REFUSED: dict[bytes, tuple[float, float, str]] = {}
REMEMBER_S = 600.0
_LENGTHS: dict[int, np.ndarray] = {}
_TRUSTED: dict[bytes, None] = {}
_LOCK = threading.Lock()


def digest(*parts: str) -> bytes:
    """What the tables remember a grammar by: the SHA-256 of `parts` (32 bytes, whatever their size)."""
    return hashlib.sha256("\0".join(parts).encode("utf-8", "surrogatepass")).digest()


def trust(source: str) -> str:
    """Mark a grammar specstruct wrote itself (the tool-call grammar: its own lexemes, user schemas only inside
    %json, whose lexemes are delimited) as needing no probe: a probe of one costs a second or two per tool set."""
    with _LOCK:
        _TRUSTED[digest(source)] = None
        while len(_TRUSTED) > 1024:
            _TRUSTED.pop(next(iter(_TRUSTED)))
    return source


def trusted(source: str) -> bool:
    """Whether specstruct wrote this grammar itself (see `trust`)."""
    return digest(source) in _TRUSTED


def probe(matcher: Any, vocab_size: int, key: tuple[str, str], token_bytes: Any = None) -> None:
    """Raise ConstraintError if random walks of `matcher` (a fresh LLMatcher) do not finish within the time limit.
    `token_bytes` (the token table's) lets half the walks take the longest allowed token at each step. A matcher
    already in its own child (grammar_worker.RemoteMatcher) is walked there: past the budget that child is killed."""
    name = digest(*key)
    refused = _REFUSED.get(name)
    budget = min(limits().time_s, 10.0)
    if refused is not None and refused[0] >= budget and time.monotonic() - refused[1] < REMEMBER_S:
        raise ConstraintError(refused[2])  # looped within as long a budget, lately: at once, not after another wait
    if name in _PASSED or trusted(key[1]) or not hasattr(os, "fork"):
        return
    lengths = None if token_bytes is None else _lengths(token_bytes)
    if isinstance(matcher, RemoteMatcher):
        if not matcher.walk(vocab_size, lengths, budget):
            _refuse(name, budget)
        _passed(name)
        return
    try:
        with warnings.catch_warnings():  # Python 3.12+ warns about fork() with threads running: the child runs
            warnings.simplefilter("ignore", DeprecationWarning)  # only llguidance and numpy, takes no lock, _exits
            pid = os.fork()
    except OSError as err:  # no memory to fork (strict overcommit): unprobed, as without fork()
        warnings.warn(f"could not probe a grammar in a child process ({err}); compiling it unprobed", RuntimeWarning)
        return
    if pid == 0:  # the child: only llguidance and numpy run here, then it leaves without any cleanup
        code = 0
        try:
            signal.alarm(int(budget) + 2)  # dies by itself if the parent is gone (an orphan spinning at 100% CPU)
            walk(matcher, vocab_size, lengths)
        except BaseException:  # noqa: BLE001 - an error is not a hang; the parent sees it in normal use
            code = 1
        os._exit(code)
    status = _wait(pid, time.monotonic() + budget)
    if status is None:
        _refuse(name, budget)
    if os.WIFSIGNALED(status):  # llguidance crashed on it: in this process it would take the server down
        raise ConstraintError(f"llguidance crashed on this grammar in a probe (signal {os.WTERMSIG(status)}); "
                              "simplify the grammar")
    _passed(name)


def _passed(name: bytes) -> None:
    with _LOCK:
        _PASSED[name] = None
        while len(_PASSED) > 1024:
            _PASSED.pop(next(iter(_PASSED)))


def _refuse(name: bytes, budget: float) -> None:
    err = too_complex("the grammar", "time_s", f"its first masks did not finish within {budget:g} s; "
                      "llguidance loops on some grammars, e.g. two adjacent terminals of one repeated character "
                      "(`start: A A` with `A: /b+/`): put a literal between them or merge them into one terminal")
    with _LOCK:
        _REFUSED[name] = (budget, time.monotonic(), str(err))
        while len(_REFUSED) > 256:
            _REFUSED.pop(next(iter(_REFUSED)))
    raise err


def _wait(pid: int, deadline: float) -> int | None:
    """The child's wait status, or None after killing it at `deadline`. The child is always reaped, also when this
    thread is interrupted (Ctrl-C) or someone else reaped it (SIGCHLD ignored: read as a clean exit)."""
    reaped = False
    try:
        while time.monotonic() < deadline:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                reaped = True
                return status
            time.sleep(0.005)
        return None
    except ChildProcessError:
        reaped = True  # nothing to kill: a reaped pid may already belong to another process
        return 0
    finally:
        if not reaped:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)


def _lengths(token_bytes: Any) -> np.ndarray:
    key = id(token_bytes)
    if key not in _LENGTHS:
        _LENGTHS.clear()  # one tokenizer's at a time is enough
        _LENGTHS[key] = np.array([len(b) if b else 0 for b in token_bytes], dtype=np.int32)
    return _LENGTHS[key]
