"""Walk a new Lark grammar in a forked child first, because llguidance can loop forever on some grammars.

llguidance 1.9.1 never returns from a mask of some small grammars (two adjacent terminals of one repeated
character, e.g. `start: A A` with `A: /b+/`, or `A B` with `A: /a+/`, `B: /a/`): no fuel limit stops it, memory
grows, and the call holds the GIL, so the whole process (every other request of a server) freezes. A user's grammar
therefore first runs a few random walks (masks, forced text, random allowed tokens) in a forked child under a time
limit; a child that does not finish is killed and the grammar is refused as too complex. The walks cannot prove a
grammar safe (a loop deep in a long grammar may not be reached), but they catch the loop wherever it sits near the
start, which is where the known cases put it. Grammars that passed are remembered (per tokenizer), so a grammar is
probed once per process. Without os.fork (Windows) nothing is probed.
"""

from __future__ import annotations

import os
import random
import signal
import time
import warnings
from typing import Any

import numpy as np

from specstruct.constraints.limits import limits, too_complex

WALKS, STEPS = 6, 48
_PASSED: dict[tuple[str, str], None] = {}  # (tokenizer key, grammar source) -> probed; insertion-ordered, bounded


def probe(matcher: Any, vocab_size: int, key: tuple[str, str]) -> None:
    """Raise ConstraintError if random walks of `matcher` (a fresh LLMatcher) do not finish within the time limit."""
    if key in _PASSED or not hasattr(os, "fork"):
        return
    budget = min(limits().time_s, 10.0)
    with warnings.catch_warnings():  # Python 3.12+ warns about fork() with threads running: the child runs only
        warnings.simplefilter("ignore", DeprecationWarning)  # llguidance and numpy, takes no lock, and _exits
        pid = os.fork()
    if pid == 0:  # the child: only llguidance and numpy run here, then it leaves without any cleanup
        code = 0
        try:
            _walk(matcher, vocab_size)
        except BaseException:  # noqa: BLE001 - an error is not a hang; the parent sees it in normal use
            code = 1
        os._exit(code)
    deadline = time.monotonic() + budget
    while time.monotonic() < deadline:
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done:
            _PASSED[key] = None
            while len(_PASSED) > 1024:
                _PASSED.pop(next(iter(_PASSED)))
            return
        time.sleep(0.005)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    raise too_complex("the grammar", "time_s", f"its first masks did not finish within {budget:g} s; llguidance "
                      "loops on some grammars, e.g. two adjacent terminals of one repeated character "
                      "(`start: A A` with `A: /b+/`): put a literal between them or merge them into one terminal")


def _walk(matcher: Any, vocab_size: int) -> None:
    rng = random.Random(0)
    for _ in range(WALKS):
        m = matcher.deep_copy()
        for _ in range(STEPS):
            if m.is_stopped() or m.is_error():
                break
            m.compute_ff_bytes()  # forced text: the other call that can loop
            bits = np.unpackbits(np.frombuffer(m.compute_bitmask(), dtype=np.uint8), bitorder="little")
            allowed = np.flatnonzero(bits[:vocab_size])
            if not len(allowed):
                break
            m.consume_token(int(allowed[rng.randrange(len(allowed))]))
