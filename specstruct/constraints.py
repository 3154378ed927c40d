"""ConstraintSpec + tokenizer -> Constraint: a token automaton with an explicit, rollback-able state.

    json  --prepare_schema--> schema --outlines_core--> regex --+
    regex ------------------------------------------------------+--> outlines_core Index --> AutomatonConstraint
    choice --escape + join---------------------------------------+
    grammar --llguidance (Lark)--> LLMatcher ----------------------> GrammarConstraint
    text / code ----------------------------------------------------> FreeTextConstraint

Compiling an Index is the slow part (0.3-2 s on a 150k vocabulary), so compiled programs are cached in
memory per (tokenizer, spec) and on disk under ~/.cache/specstruct/constraints (env SPECSTRUCT_CACHE).
outlines_core 0.2.14 drops every transition out of a state where the regex could already end when the
continuation needs more than one byte: `a(bc)?` rejects "abc", a top-level number rejects "3.25",
Choice(["yes", "yes please"]) rejects the second. So every regex is compiled as `(?:R)\x00`, with NUL
spelled only by a reserved token id: no state is final before the terminator, and "could R end here?"
is answered by "may the terminator follow?". Real tokens containing NUL are never legal.

JSON is generated in `json.dumps` form: ", " and ": " between items, nothing after "{" or "[", so the
automaton forces long stretches of text (`{"name": "`) that the speculative drafter can propose for free.
"""

from __future__ import annotations

import codecs
import hashlib
import json
import os
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from specstruct.errors import ConstraintError
from specstruct.grammar_constraint import GrammarConstraint
from specstruct.interfaces import ConstraintSpec
from specstruct.schema_check import prepare_schema
from specstruct.token_table import TERMINATOR_ID, TokenTable, token_table

__all__ = ["compile_constraint", "AutomatonConstraint", "GrammarConstraint", "FreeTextConstraint",
           "json_regex", "choice_regex", "cache_dir"]

_WS = "\x00ws\x00"  # whitespace placeholder, resolved by json_regex
_DONE = -1  # state after EOS: only EOS stays legal
MASK_CACHE_BYTES = 128 * 2**20
_FORMAT_VERSION = "2"


def cache_dir() -> Path:
    return Path(os.environ.get("SPECSTRUCT_CACHE", Path.home() / ".cache" / "specstruct")) / "constraints"


def json_regex(schema: dict | str) -> str:
    """The regex of `schema`'s instances as `json.dumps(value, ensure_ascii=False)` writes them."""
    from outlines_core.json_schema import build_regex_from_schema

    prepared = prepare_schema(schema)
    try:
        raw = build_regex_from_schema(json.dumps(prepared), _WS)
    except (ValueError, RuntimeError) as e:
        raise ConstraintError(f"outlines_core cannot compile this JSON schema: {e}".strip()) from e
    # Every structural ',' and ':' touches a placeholder: give it exactly one space after, as json.dumps
    # does, inside whatever optional group holds it ("(, "b": ...)?"), and drop the other placeholders.
    for sep in (",", ":"):
        raw = raw.replace(_WS + sep + _WS, sep + " ").replace(_WS + sep, sep + " ").replace(sep + _WS, sep + " ")
    return raw.replace(_WS, "")


def choice_regex(options: Sequence[str]) -> str:
    """An alternation matching exactly one of `options` (escaped for the Rust regex syntax)."""
    if not options:
        raise ConstraintError("Choice needs at least one option; pass a non-empty list of strings.")
    if any("\x00" in str(o) for o in options):
        raise ConstraintError("Choice options cannot contain NUL characters; remove them.")
    meta = set("\\.+*?()|[]{}^$#&-~")

    def esc(s: str) -> str:
        return "".join("\\" + c if c in meta else c if c.isprintable() else f"\\x{{{ord(c):x}}}" for c in s)

    return "(" + "|".join(esc(str(o)) for o in options) + ")"


class _Program:
    """What a compiled regex shares between all its Constraint instances: the Index and per-state caches."""

    def __init__(self, index, table: TokenTable, vocab_size: int, eos_ids: Sequence[int]):
        self.index, self.table, self.vocab_size = index, table, vocab_size
        self.eos_ids = sorted({int(e) for e in eos_ids if 0 <= int(e) < vocab_size})
        self.initial = index.get_initial_state()
        self._ends = set(index.get_final_states())  # states after the NUL terminator
        self._final: dict[int, bool] = {}
        self._masks: OrderedDict[int, torch.Tensor] = OrderedDict()
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
        with self._lock:
            hit = self._masks.get(state)
            if hit is not None:
                self._masks.move_to_end(state)
                return hit
        bits = np.zeros(self.vocab_size, dtype=np.bool_)  # numpy scatter: ~20x faster than torch's here
        if state != _DONE:
            bits[self.allowed(state)] = True
        if self.is_final(state):
            bits[self.eos_ids] = True
        m = torch.from_numpy(bits)
        with self._lock:
            self._masks[state] = m
            while len(self._masks) > self.max_masks:
                self._masks.popitem(last=False)
        return m

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
            ids = self.allowed(s)
            if len(ids) == 0:
                break
            first = np.unique(self.table.first_byte[ids])
            if len(first) != 1 or first[0] < 0 or int(first[0]) not in self.table.byte_token:
                break
            nxt = self.index.get_next_state(s, self.table.byte_token[int(first[0])])
            if nxt is None:
                break
            out.append(int(first[0]))
            s = nxt
        text = codecs.getincrementaldecoder("utf-8")(errors="replace").decode(bytes(out), final=False)
        self._forced[state] = text
        return text


class _Base:
    mode: str
    vocab_size: int
    _tokenizer: object

    def accepts(self, text: str) -> bool:
        """Would `text`, tokenized as the engine tokenizes, complete the output from the current state?
        (A fresh constraint: from the start.) Walks a fork, so this constraint does not move."""
        ids = self._tokenizer.encode(text, add_special_tokens=False)
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
                 consumed: list[bool] | None = None, legal: torch.Tensor | None = None):
        self.mode, self.vocab_size, self._tokenizer, self._table = mode, vocab_size, tokenizer, table
        self._eos = {int(e) for e in eos_ids if 0 <= int(e) < vocab_size}
        self._consumed = consumed if consumed is not None else []  # True where the token was an EOS
        if legal is None:
            legal = torch.zeros(vocab_size, dtype=torch.bool)
            legal[: min(table.n_real, vocab_size)] = True
            legal[[i for i in table.special if i < vocab_size]] = False
            legal[sorted(self._eos)] = True
        self._legal = legal
        self._eos_only = torch.zeros(vocab_size, dtype=torch.bool)
        self._eos_only[sorted(self._eos)] = True

    def _done(self) -> bool:
        return bool(self._consumed) and self._consumed[-1]

    def mask(self) -> torch.Tensor:
        return self._eos_only if self._done() else self._legal

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
                                  list(self._consumed), self._legal)


_PROGRAMS: dict[tuple, _Program] = {}
_PROGRAMS_LOCK = threading.Lock()


def compile_constraint(spec: ConstraintSpec, tokenizer, *, vocab_size: int, eos_token_ids: Sequence[int]):
    """Compile `spec` for `tokenizer` into a fresh Constraint at its initial state (cached compilation)."""
    table = token_table(tokenizer)
    eos = [int(e) for e in eos_token_ids] or [table.eos_id]
    if spec.kind in ("text", "code"):
        return FreeTextConstraint(table, vocab_size, eos, spec.mode, tokenizer)
    if spec.kind == "grammar":
        return GrammarConstraint.compile(spec.source or "", tokenizer, table, vocab_size, eos, spec.mode)
    if spec.kind == "json":
        regex = json_regex(spec.source or "{}")
    elif spec.kind == "choice":
        regex = choice_regex(json.loads(spec.source or "[]"))
    elif spec.kind == "regex":
        regex = spec.source or ""
        _check_regex_syntax(regex, spec)
    else:
        raise ConstraintError(f"unknown constraint kind {spec.kind!r}; use json, regex, choice, grammar, code or text.")
    key = (table.key, regex, vocab_size, tuple(sorted(eos)))
    with _PROGRAMS_LOCK:
        program = _PROGRAMS.get(key)
    if program is None:
        program = _Program(_index(regex, table, spec), table, vocab_size, eos)
        if spec.kind == "json" and program.is_final(program.initial):
            raise ConstraintError("this JSON schema admits no value (its language is empty); check enum/const "
                                  "lists and min/max bounds.")
        with _PROGRAMS_LOCK:
            _PROGRAMS[key] = program
    return AutomatonConstraint(program, spec.mode, tokenizer)


def _index(regex: str, table: TokenTable, spec: ConstraintSpec):
    """The outlines_core Index of `regex`, from the disk cache when possible."""
    from outlines_core import Index

    digest = hashlib.sha256(f"{_FORMAT_VERSION}\0{regex}".encode()).hexdigest()[:32]
    path = cache_dir() / table.key / f"{digest}.index"
    if path.exists():
        try:
            return Index.from_binary(path.read_bytes())
        except Exception:  # a corrupt or stale entry: rebuild it
            path.unlink(missing_ok=True)
    try:
        index = Index(f"(?:{regex})\\x00", table.vocabulary())
    except (ValueError, RuntimeError) as e:
        raise _regex_error(regex, spec, str(e)) from e
    _write_atomic(path, index.__reduce__()[1][0])
    return index


def _check_regex_syntax(regex: str, spec: ConstraintSpec) -> None:
    """Parse a user regex on its own first: it is wrapped as `(?:R)\\x00`, so `a)|(b` must not slip through."""
    from llguidance import LLMatcher

    if LLMatcher.validate_grammar(LLMatcher.grammar_from_regex(regex)):
        raise _regex_error(regex, spec, "")


def _regex_error(regex: str, spec: ConstraintSpec, message: str) -> ConstraintError:
    if "incompatible with the regex" in message or "no transitions" in message:
        return ConstraintError(f"the {spec.kind} constraint admits no output this tokenizer can write "
                               f"(empty or unsatisfiable language): {message}")
    from llguidance import LLMatcher  # its regex parser is the same Rust crate and says where it failed

    detail = LLMatcher.validate_grammar(LLMatcher.grammar_from_regex(regex)) or message
    shown = regex if len(regex) < 200 else regex[:200] + "..."
    return ConstraintError(f"invalid regex {shown!r}: {detail.strip()}\nFix the pattern (Rust regex syntax: "
                           "no look-around or back-references).")


def _write_atomic(path: Path, data: bytes) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, path)
    except OSError:
        pass  # a read-only cache only costs compile time
