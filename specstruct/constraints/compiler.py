"""ConstraintSpec + tokenizer -> Constraint: a token automaton with an explicit, rollback-able state.

    json  --llguidance JSON compiler (default)---------------------> GrammarConstraint
    json  --prepare_schema--> schema --outlines_core--> regex --+   (json_backend="outlines")
    regex ------------------------------------------------------+--> outlines_core Index --> AutomatonConstraint
    choice --escape + join---------------------------------------+
    grammar --llguidance (Lark)--> LLMatcher ----------------------> GrammarConstraint
    text / code ----------------------------------------------------> FreeTextConstraint

JSON goes through llguidance by default (llguidance/json_schema.py; `json_backend="outlines"` or env
SPECSTRUCT_JSON_BACKEND=outlines selects the regex path). Compiling an outlines_core Index is the slow part
(0.3-2 s on a 150k vocabulary, minutes or tens of GB for hostile regexes), so it runs in a bounded worker
process (isolate.py, limits.py) and compiled programs are cached in a byte-bounded LRU per (tokenizer, spec)
and on disk under ~/.cache/specstruct/constraints (env SPECSTRUCT_CACHE; pruned to `disk_cache_mb`).
Every regex is compiled as `(?:R)\x00` to work around an outlines_core bug (see automaton.py); JSON is
written in `json.dumps` form (see regexes.py).
"""

from __future__ import annotations

import hashlib
import json
import re
from importlib.metadata import version
from pathlib import Path
from typing import Sequence, get_args

from specstruct.constraints.cache import ByteLRU, cache_dir, prune_disk, read_entry, seal, write_atomic
from specstruct.constraints.llguidance import grammar_worker
from specstruct.constraints.llguidance.grammar_probe import probe, trusted
from specstruct.constraints.outlines.isolate import build_index_bytes
from specstruct.constraints.llguidance.json_schema import check_support, compile_json, parse_schema
from specstruct.constraints.limits import check_regex, limits, too_complex
from specstruct.constraints.outlines.automaton import AutomatonConstraint, FreeTextConstraint, _Program
from specstruct.errors import ConstraintError
from specstruct.constraints.llguidance.grammar import GrammarConstraint, _lltokenizer, check_lark
from specstruct.constraints.base import ConstraintSpec
from specstruct.constraints.outlines.regexes import choice_regex, json_regex
from specstruct.constraints.outlines.token_table import TokenTable, token_table
from specstruct.settings import JsonBackend, settings

__all__ = ["compile_constraint", "check_spec", "AutomatonConstraint", "GrammarConstraint", "FreeTextConstraint",
           "json_regex", "choice_regex", "cache_dir"]

_FORMAT_VERSION = "4"  # 4: Index.from_binary bytes in a checked entry (never unpickled), keyed by outlines_core
OUTLINES_CORE_VERSION = version("outlines_core")  # an Index built by another release may not load or mean the same
_VERBOSE = re.compile(r"\(\?[a-zA-Z]*x[a-zA-Z]*\)")  # a leading flag group that turns on verbose mode
_NUL_ESCAPE = re.compile(r"\\(x00|x\{0+\}|0|u0000|U00000000)")
JSON_BACKENDS: tuple[str, ...] = get_args(JsonBackend)


_PROGRAMS = ByteLRU(lambda: limits().cache_mb << 20)  # outlines_core programs, charged index + mask cache


def default_json_backend() -> str:
    """Setting SPECSTRUCT_JSON_BACKEND (llguidance or outlines), default llguidance (see docs/conformance.md)."""
    return settings().json_backend


def prepare(tokenizer, vocab_size: int) -> None:
    """Build what every constraint over `tokenizer` shares, once per process: its token table (read from the disk
    cache where an earlier process wrote it) and llguidance's tokenizer (about a second, and rebuilt by every
    process), so that the first constrained request does not pay for them. `from_pretrained` calls it."""
    table = token_table(tokenizer)
    _lltokenizer(tokenizer, table, vocab_size)


def _check_encodable(spec: ConstraintSpec) -> None:
    """A regex, grammar or schema holding a lone surrogate (possible in a Python str, or a JSON "\\ud800" escape)
    has no UTF-8 form for the compilers to read."""
    try:
        (spec.source or "").encode("utf-8")
    except UnicodeEncodeError as e:
        raise ConstraintError(f"the {spec.kind} holds a lone surrogate ({spec.source[e.start]!r} at character "
                              f"{e.start}), which has no UTF-8 encoding: remove it or write the whole character"
                              ) from None


def compile_constraint(spec: ConstraintSpec, tokenizer, *, vocab_size: int, eos_token_ids: Sequence[int],
                       json_backend: str | None = None):
    """Compile `spec` for `tokenizer` into a fresh Constraint at its initial state (cached compilation).
    Every compile is bounded by limits.limits(): past them it raises ConstraintError naming the limit."""
    _check_encodable(spec)
    table = token_table(tokenizer)
    eos = [int(e) for e in eos_token_ids] or [table.eos_id]
    if spec.kind in ("text", "code"):
        return FreeTextConstraint(table, vocab_size, eos, spec.mode, tokenizer)
    if spec.kind == "grammar":  # (checked by the compile itself, under the compile limits)
        grammar = GrammarConstraint.compile(spec.source or "", tokenizer, table, vocab_size, eos, spec.mode)
        probe(grammar._m, vocab_size, (table.key, spec.source or ""), table.token_bytes)  # llguidance can loop
        if not trusted(spec.source or "") and grammar_worker.available():  # ... also deeper in than the probe goes
            grammar._m = grammar_worker.isolate(grammar._m)
        try:
            empty = not grammar.is_final() and not bool(grammar.mask().any())
        except ConstraintError:  # llguidance reports an empty language as a parser error at the first mask
            empty = True
        if empty:
            raise ConstraintError("this grammar admits no output (its start rule matches nothing this tokenizer "
                                  "can write); check the start rule and its terminals.")
        return grammar
    backend = json_backend or default_json_backend()
    if spec.kind == "json" and backend == "llguidance":
        return compile_json(spec.source or "{}", tokenizer, table, vocab_size, eos, spec.mode)
    regex = check_spec(spec, json_backend=backend)
    if spec.kind == "json":
        check_regex(regex, "the JSON schema")
    key = (table.key, regex, vocab_size, tuple(sorted(eos)))
    program = _PROGRAMS.get(key)
    if program is None:
        index, size = _index(regex, table, spec)
        program = _Program(index, table, vocab_size, eos)
        if spec.kind == "json" and program.is_final(program.initial):
            raise ConstraintError("this JSON schema admits no value (its language is empty); check enum/const "
                                  "lists and min/max bounds.")
        _PROGRAMS.put(key, program, size + program.max_masks * vocab_size)
    return AutomatonConstraint(program, spec.mode, tokenizer)


def check_spec(spec: ConstraintSpec, *, json_backend: str | None = None) -> str | None:
    """Everything about `spec` that needs no tokenizer, raising ConstraintError: regex syntax, grammar syntax,
    JSON-schema support. Returns the regex of automaton kinds (None for grammar, text, code). Cheap enough to
    run before loading a model (the CLI does)."""
    if spec.kind in ("text", "code"):
        return None
    if spec.kind == "grammar":
        check_lark(spec.source or "")  # in a child under the compile limits: llguidance's has no clock
        return None
    if spec.kind == "json":
        if (json_backend or default_json_backend()) == "llguidance":
            check_support(spec.source or "{}")  # keyword support, naming the JSON path; no tokenizer needed
            return None
        return _outlines_json_regex(spec.source or "{}")
    if spec.kind == "choice":
        regex = choice_regex(json.loads(spec.source or "[]"))
        check_regex(regex, "the choice constraint")
        return regex
    if spec.kind == "regex":
        regex = _whole_match(spec.source or "")
        verbose = _VERBOSE.match(regex) is not None
        if verbose:  # (?x) for the whole pattern: a trailing `# comment` must end before the wrapper's `)`
            regex += "\n"
        at = None if verbose else inner_anchor(regex)  # (a comment may mention ^ or $)
        if at is not None:
            atom = regex[at:at + 2] if regex[at] == "\\" else regex[at]
            raise ConstraintError(f"the regex has an anchor ({atom!r} at character {at}) inside it; a regex "
                                  "constraint always matches the whole output, so anchors are only allowed at its "
                                  "very start and end: remove it (for example 'a$|b' -> 'a|b').")
        if spells_nul(regex):
            raise ConstraintError("a regex cannot match a NUL character (specstruct reserves NUL to mark the end "
                                  "of output); remove \\x00 from the pattern.")
        _check_regex_syntax(regex, spec)
        check_regex(regex, "the regex constraint")
        return regex
    raise ConstraintError(f"unknown constraint kind {spec.kind!r}; use json, regex, choice, grammar, code or text.")


def _scan(regex: str):
    """(index, atom, inside a class, that class negated) for each escape (`\\x00`, `\\$`: the backslash and what
    follows) or character of a regex, left to right. Linear, no compiling: the regex is still untrusted here."""
    i, n, in_class, negated = 0, len(regex), False, False
    while i < n:
        c = regex[i]
        if c == "\\":
            m = _NUL_ESCAPE.match(regex, i)
            atom = m.group(0) if m else regex[i:i + 2]
            yield i, atom, in_class, negated
            i += 2
            continue
        yield i, c, in_class, negated
        if c == "[" and not in_class:
            in_class, negated = True, regex.startswith("^", i + 1)
            i += 2 + negated if regex.startswith("]", i + 1 + negated) else 1 + negated  # a leading ] is literal
            continue
        if c == "]" and in_class:
            in_class = False
        i += 1


def spells_nul(regex: str) -> bool:
    """True when the regex can write a NUL: a NUL character or escape outside a negated class (`[^\\x00-\\x1f]+`
    excludes NUL, so it is fine; an escaped backslash before `x00` is a backslash)."""
    return any((atom == "\x00" or _NUL_ESCAPE.fullmatch(atom)) and not (in_class and negated)
               for _, atom, in_class, negated in _scan(regex))


def inner_anchor(regex: str) -> int | None:
    """The index of an anchor (`^`, `$`, `\\A`, `\\z`, `\\Z`: unescaped, outside a class) left in a whole-match
    regex, or None."""
    return next((i for i, atom, in_class, _ in _scan(regex) if atom in ANCHORS and not in_class), None)


ANCHORS = ("^", "$", "\\A", "\\z", "\\Z")


def _whole_match(regex: str) -> str:
    """A regex constraint always matches the whole output, so a leading `^` / `\\A` and a trailing `$` / `\\z` add
    nothing; the automaton builder refuses anchors, so they are dropped (`^[0-9]+$` is `[0-9]+`). Anchors elsewhere
    stay (and are refused with the builder's message)."""
    if regex.startswith(("^", "\\A")):
        regex = regex[1 if regex[0] == "^" else 2:]
    for end in ("$", "\\z", "\\Z"):
        body = regex[: -len(end)]
        if regex.endswith(end) and (len(body) - len(body.rstrip("\\"))) % 2 == 0:  # not an escaped \$ or \\z
            return body
    return regex


def _outlines_json_regex(source: str) -> str:
    schema = parse_schema(source)  # size and depth limits first: no RecursionError further on
    try:
        return json_regex(schema)
    except RecursionError as e:
        raise too_complex("the JSON schema", "max_schema_depth", "its $refs nest too deeply") from e


def _index(regex: str, table: TokenTable, spec: ConstraintSpec):
    """The outlines_core Index of `regex` and its size in bytes, from the disk cache when possible, else
    built in the bounded compile worker (isolate.py)."""
    from outlines_core import Index

    path = index_path(regex, table)
    hit = read_entry(path, "outlines-index", Index.from_binary)  # a bad entry is discarded: rebuilt below
    if hit is not None:
        return hit
    what = "the JSON schema" if spec.kind == "json" else f"the {spec.kind} constraint"
    try:
        data = build_index_bytes(f"(?:{regex})\\x00", table, what)
    except ConstraintError:
        raise
    except ValueError as e:
        raise _regex_error(regex, spec, str(e)) from e
    write_atomic(path, seal("outlines-index", data))
    prune_disk(cache_dir(), limits().disk_cache_mb << 20)
    return Index.from_binary(data), len(data)


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
