"""The random walks the grammar probe runs on a new matcher (grammar_probe.py), in a forked child of its own or in
the child that holds the matcher (grammar_worker.py): they call what llguidance can loop in, so a grammar whose
walks do not finish in time is refused.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from llguidance import LLMatcher

WALKS, STEPS = 6, 256  # half the walks take the longest allowed token: deep into long terminals in few steps


def walk(matcher: LLMatcher, vocab_size: int, lengths: np.ndarray | None = None) -> None:
    """WALKS walks of copies of `matcher`, at most STEPS tokens each: at each step its forced text, its mask and a
    random allowed token (in every second walk the longest allowed one, when `lengths` gives each token's length in
    bytes)."""
    rng = random.Random(0)
    for i in range(WALKS):
        longest = lengths is not None and i % 2 == 1
        m = matcher.deep_copy()
        for _ in range(STEPS):
            if m.is_stopped() or m.is_error():
                break
            m.compute_ff_bytes()  # forced text: the other call that can loop
            bits = np.unpackbits(np.frombuffer(m.compute_bitmask(), dtype=np.uint8), bitorder="little")
            allowed = np.flatnonzero(bits[:vocab_size])
            if not len(allowed):
                break
            if longest:
                known = allowed[allowed < len(lengths)]
                if len(known):
                    size = lengths[known]
                    allowed = known[size == size.max()]
            m.consume_token(int(allowed[rng.randrange(len(allowed))]))
