"""Regex automata over real token bytes, walked with an explicit state stack (outlines_core Index).

outlines_core 0.2.14 drops every transition out of a state where the regex could already end when the
continuation needs more than one byte: `a(bc)?` rejects "abc", a top-level number rejects "3.25",
Choice(["yes", "yes please"]) rejects the second. So constraints.py compiles every regex as
`(?:R)\x00`, with NUL spelled only by a reserved token id (TERMINATOR_ID): no state is final before the
terminator, and "could R end here?" is answered by "may the terminator follow?". Real tokens
containing NUL are never legal.

A `_Program` (one per compiled regex and tokenizer) is shared by all its constraints and caches, per
state: the mask (bounded LRU), finality and forced text. A constraint is just a list of states, so
`fork()` copies a list and `rollback(n)` pops n entries.
"""

from __future__ import annotations

import codecs
import threading
from collections import OrderedDict
from typing import Callable, Sequence

import numpy as np
import torch

from specstruct.constraints.base import output_text, pack_mask
from specstruct.constraints.outlines.token_table import TERMINATOR_ID, TokenTable

_DONE = -1  # state after EOS: only EOS stays legal
MASK_CACHE_BYTES = 32 * 2**20  # per program; bool masks cost vocab_size bytes each


class _Program:
    """What a compiled regex shares between all its Constraint instances: the Index and per-state caches."""

    def __init__(self, index, table: TokenTable, vocab_size: int, eos_ids: Sequence[int]):
        self.index, self.table, self.vocab_size = index, table, vocab_size
        self.eos_ids = sorted({int(e) for e in eos_ids if 0 <= int(e) < vocab_size})
        self.initial = index.get_initial_state()
        self._ends = set(index.get_final_states())  # states after the NUL terminator
        self._final: dict[int, bool] = {}
        self._masks: OrderedDict[int, torch.Tensor] = OrderedDict()
        self._words: OrderedDict[int, torch.Tensor] = OrderedDict()  # the same masks as bitmask words
        self._forced: dict[int, str] = {}
        self._lock = threading.Lock()
        self.max_masks = max(8, MASK_CACHE_BYTES // max(vocab_size, 1))

    def is_final(self, state: int) -> bool:
        """Could the output end here? (The terminator may follow.)"""
        if state == _DONE:
            return True
        hit = self._final.get(state)
        if hit is None:
            hit = self._final[state] = self.index.get_next_state(state, TERMINATOR_ID) in self._ends
        return hit

    def allowed(self, state: int) -> np.ndarray:
        ids = np.asarray(self.index.get_allowed_tokens(state) or [], dtype=np.int64)
        return ids[(ids < self.table.n_real) & ~np.isin(ids, self.table.eos_like)]

    def mask(self, state: int) -> torch.Tensor:
        return self._cached(self._masks, state, self._build_mask)

    def words(self, state: int) -> torch.Tensor:
        """The mask of `state` as bitmask words (packed once, kept in an LRU as the masks are)."""
        return self._cached(self._words, state, lambda s: pack_mask(self.mask(s)))

    def _build_mask(self, state: int) -> torch.Tensor:
        bits = np.zeros(self.vocab_size, dtype=np.bool_)  # numpy scatter: ~20x faster than torch's here
        if state != _DONE:
            bits[self.allowed(state)] = True
        if self.is_final(state):
            bits[self.eos_ids] = True
        return torch.from_numpy(bits)

    def _cached(self, cache: "OrderedDict[int, torch.Tensor]", state: int,
                build: Callable[[int], torch.Tensor]) -> torch.Tensor:
        """`cache[state]`, built on a miss; the cache is an LRU of at most max_masks states."""
        with self._lock:
            hit = cache.get(state)
            if hit is not None:
                cache.move_to_end(state)
                return hit
        made = build(state)
        with self._lock:
            cache[state] = made
            while len(cache) > self.max_masks:
                cache.popitem(last=False)
        return made

    def step(self, state: int, token: int) -> int | None:
        if token in self.eos_ids:
            return _DONE if self.is_final(state) else None
        if state == _DONE or token >= self.table.n_real or token in self.table.special:
            return None
        return self.index.get_next_state(state, token)

    def forced(self, state: int) -> str:
        """Bytes every continuation shares, walked one single-byte token at a time."""
        if state in self._forced:
            return self._forced[state]
        out, s = bytearray(), state
        while not self.is_final(s) and len(out) < 4096:
            step = self._forced_byte(s)
            if step is None:
                break
            out.append(step[0])
            s = step[1]
        text = codecs.getincrementaldecoder("utf-8")(errors="replace").decode(bytes(out), final=False)
        self._forced[state] = text
        return text


    def _forced_byte(self, s: int) -> tuple[int, int] | None:
        """(byte, next state) when every legal continuation starts with the same byte, else None."""
        byte_token = self.table.byte_token
        if len(byte_token) >= 255:  # byte-level vocabulary: a live multi-byte token implies its first byte
            live = [(b, n) for b, t in byte_token.items() if (n := self.index.get_next_state(s, t)) is not None]
            return live[0] if len(live) == 1 else None
        ids = self.allowed(s)  # other vocabularies: the first bytes of all allowed tokens
        first = np.unique(self.table.first_byte[ids]) if len(ids) else []
        if len(first) != 1 or first[0] < 0 or int(first[0]) not in byte_token:
            return None
        n = self.index.get_next_state(s, byte_token[int(first[0])])
        return None if n is None else (int(first[0]), n)


class _Base:
    mode: str
    vocab_size: int
    _tokenizer: object

    def accepts(self, text: str) -> bool:
        """Would `text`, tokenized as the engine tokenizes, complete the output from the current state?
        (A fresh constraint: from the start.) Walks a fork, so this constraint does not move."""
        ids = self._tokenizer.encode(output_text(text), add_special_tokens=False, split_special_tokens=True)
        probe = self.fork()
        return probe.advance(ids) == len(ids) and probe.is_final()


class AutomatonConstraint(_Base):
    """A regex automaton (outlines_core Index) walked with an explicit stack of int states."""

    def __init__(self, program: _Program, mode: str, tokenizer, states: list[int] | None = None):
        self._p, self.mode, self._tokenizer = program, mode, tokenizer
        self.vocab_size = program.vocab_size
        self._states = states if states is not None else [program.initial]

    def mask(self) -> torch.Tensor:
        return self._p.mask(self._states[-1])

    def fill_bitmask(self, out: torch.Tensor) -> None:
        out.copy_(self._p.words(self._states[-1]))

    def advance(self, tokens: Sequence[int]) -> int:
        n = 0
        for t in tokens:
            nxt = self._p.step(self._states[-1], int(t))
            if nxt is None:
                break
            self._states.append(nxt)
            n += 1
        return n

    def rollback(self, n: int) -> None:
        if n < 0 or n > len(self._states) - 1:
            raise ValueError(f"cannot roll back {n} tokens: only {len(self._states) - 1} were consumed")
        if n:
            del self._states[-n:]

    def forced_text(self) -> str:
        return self._p.forced(self._states[-1])

    def is_final(self) -> bool:
        return self._p.is_final(self._states[-1])

    def fork(self) -> "AutomatonConstraint":
        return AutomatonConstraint(self._p, self.mode, self._tokenizer, list(self._states))


class FreeTextConstraint(_Base):
    """Any real token, EOS anywhere: code and free text."""

    def __init__(self, table: TokenTable, vocab_size: int, eos_ids: Sequence[int], mode: str, tokenizer,
                 consumed: list[bool] | None = None, legal: torch.Tensor | None = None,
                 words: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None):
        self.mode, self.vocab_size, self._tokenizer, self._table = mode, vocab_size, tokenizer, table
        self._eos = {int(e) for e in eos_ids if 0 <= int(e) < vocab_size}
        self._consumed = consumed if consumed is not None else []  # True where the token was an EOS
        if legal is None:
            legal = torch.zeros(vocab_size, dtype=torch.bool)
            legal[: min(table.n_real, vocab_size)] = True
            legal[[i for i in table.special if i < vocab_size]] = False
            legal[sorted(self._eos)] = True
        self._legal = legal
        if words is None:  # (the EOS-only mask, and both masks as bitmask words: made once, shared by the forks)
            eos_only = torch.zeros(vocab_size, dtype=torch.bool)
            eos_only[sorted(self._eos)] = True
            words = (eos_only, pack_mask(legal), pack_mask(eos_only))
        self._eos_only, self._words = words[0], words[1:]

    def _done(self) -> bool:
        return bool(self._consumed) and self._consumed[-1]

    def mask(self) -> torch.Tensor:
        return self._eos_only if self._done() else self._legal

    def fill_bitmask(self, out: torch.Tensor) -> None:
        out.copy_(self._words[1] if self._done() else self._words[0])

    def advance(self, tokens: Sequence[int]) -> int:
        n = 0
        for t in tokens:
            t = int(t)
            if not (0 <= t < self.vocab_size and self.mask()[t]):
                break
            self._consumed.append(t in self._eos)
            n += 1
        return n

    def rollback(self, n: int) -> None:
        if n < 0 or n > len(self._consumed):
            raise ValueError(f"cannot roll back {n} tokens: only {len(self._consumed)} were consumed")
        if n:
            del self._consumed[-n:]

    def forced_text(self) -> str:
        return ""

    def is_final(self) -> bool:
        return True

    def fork(self) -> "FreeTextConstraint":
        return FreeTextConstraint(self._table, self.vocab_size, sorted(self._eos), self.mode, self._tokenizer,
                                  list(self._consumed), self._legal, (self._eos_only, *self._words))
