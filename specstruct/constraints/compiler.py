"""ConstraintSpec + tokenizer -> Constraint: a token automaton with an explicit, rollback-able state.

    json  --prepare_schema--> schema --outlines_core--> regex --+
    regex ------------------------------------------------------+--> outlines_core Index --> AutomatonConstraint
    choice --escape + join---------------------------------------+
    grammar --llguidance (Lark)--> LLMatcher ----------------------> GrammarConstraint
    text / code ----------------------------------------------------> FreeTextConstraint

Compiling an Index is the slow part (0.3-2 s on a 150k vocabulary), so compiled programs are cached in
memory per (tokenizer, spec) and on disk under ~/.cache/specstruct/constraints (env SPECSTRUCT_CACHE).
Every regex is compiled as `(?:R)\x00` to work around an outlines_core bug (see automaton.py); JSON is
written in `json.dumps` form (see regexes.py).
"""

from __future__ import annotations

import hashlib
import json
import pickle
import re
import threading
from importlib.metadata import version
from pathlib import Path
from typing import Sequence

from specstruct.constraints.cache import cache_dir, write_atomic
from specstruct.constraints.automaton import AutomatonConstraint, FreeTextConstraint, _Program
from specstruct.errors import ConstraintError
from specstruct.constraints.grammar import GrammarConstraint
from specstruct.constraints.base import ConstraintSpec
from specstruct.constraints.regexes import choice_regex, json_regex
from specstruct.constraints.token_table import TokenTable, token_table

__all__ = ["compile_constraint", "check_spec", "AutomatonConstraint", "GrammarConstraint", "FreeTextConstraint",
           "json_regex", "choice_regex", "cache_dir"]

_FORMAT_VERSION = "3"  # 3: pickled Index, keyed by the outlines_core version too
OUTLINES_CORE_VERSION = version("outlines_core")  # an Index built by another release may not load or mean the same
_NUL = re.compile(r"\x00|\\x00|\\x\{0+\}|\\0|\\u0000|\\U00000000")


_PROGRAMS: dict[tuple, _Program] = {}
_PROGRAMS_LOCK = threading.Lock()


def compile_constraint(spec: ConstraintSpec, tokenizer, *, vocab_size: int, eos_token_ids: Sequence[int]):
    """Compile `spec` for `tokenizer` into a fresh Constraint at its initial state (cached compilation)."""
    table = token_table(tokenizer)
    eos = [int(e) for e in eos_token_ids] or [table.eos_id]
    if spec.kind in ("text", "code"):
        return FreeTextConstraint(table, vocab_size, eos, spec.mode, tokenizer)
    if spec.kind == "grammar":
        grammar = GrammarConstraint.compile(spec.source or "", tokenizer, table, vocab_size, eos, spec.mode)
        if not grammar.is_final() and not bool(grammar.mask().any()):
            raise ConstraintError("this grammar admits no output (its start rule matches nothing this tokenizer "
                                  "can write); check the start rule and its terminals.")
        return grammar
    regex = check_spec(spec)
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


def check_spec(spec: ConstraintSpec) -> str | None:
    """Everything about `spec` that needs no tokenizer, raising ConstraintError: regex syntax, grammar syntax,
    JSON-schema support. Returns the regex of automaton kinds (None for grammar, text, code). Cheap enough to
    run before loading a model (the CLI does)."""
    if spec.kind in ("text", "code"):
        return None
    if spec.kind == "grammar":
        from llguidance import LLMatcher

        try:
            error = LLMatcher.validate_grammar(LLMatcher.grammar_from_lark(spec.source or ""))
        except (ValueError, RuntimeError) as e:
            error = str(e)
        if error:
            raise ConstraintError(f"invalid Lark grammar: {error.strip()}")
        return None
    if spec.kind == "json":
        return json_regex(spec.source or "{}")
    if spec.kind == "choice":
        return choice_regex(json.loads(spec.source or "[]"))
    if spec.kind == "regex":
        regex = spec.source or ""
        if _NUL.search(regex):
            raise ConstraintError("a regex cannot match a NUL character (specstruct reserves NUL to mark the end "
                                  "of output); remove \\x00 from the pattern.")
        _check_regex_syntax(regex, spec)
        return regex
    raise ConstraintError(f"unknown constraint kind {spec.kind!r}; use json, regex, choice, grammar, code or text.")


def _index(regex: str, table: TokenTable, spec: ConstraintSpec):
    """The outlines_core Index of `regex`, from the disk cache when possible."""
    from outlines_core import Index

    path = index_path(regex, table)
    if path.exists():
        try:
            return pickle.loads(path.read_bytes())
        except Exception:  # a corrupt or stale entry: rebuild it
            path.unlink(missing_ok=True)
    try:
        index = Index(f"(?:{regex})\\x00", table.vocabulary())
    except (ValueError, RuntimeError) as e:
        raise _regex_error(regex, spec, str(e)) from e
    write_atomic(path, pickle.dumps(index))
    return index


def index_path(regex: str, table: TokenTable) -> Path:
    """The disk-cache file of `regex`'s Index over `table` (named by format, outlines_core version and regex)."""
    digest = hashlib.sha256(f"{_FORMAT_VERSION}\0{OUTLINES_CORE_VERSION}\0{regex}".encode()).hexdigest()[:32]
    return cache_dir() / table.key / f"{digest}.index"


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
