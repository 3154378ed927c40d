"""JSON schemas and choices as regexes, in the exact text form the engine emits.

JSON is written as `json.dumps(value, ensure_ascii=False)` writes it: ", " and ": " between items,
nothing after "{" or "[", properties in schema order. outlines_core takes ONE whitespace pattern for
every gap, so we pass a placeholder and resolve it: one space after each structural ',' and ':'
(inside the optional group that holds it), nothing elsewhere. The automaton then forces long runs
of text (`{"name": "`) that the speculative drafter proposes for free.

Numeric bounds outlines_core ignores are spliced in from numeric_regex.py.

Length-bounded strings (minLength/maxLength) are written without escape sequences: outlines_core's
compile time for `(char|escape){0,n}` grows about 4x per +2 of n (20 s at n=16), while the escape-free
class compiles in linear time (n=1000: 0.1 s). Sound: fewer strings, all of them valid.
"""

from __future__ import annotations

import json
from typing import Sequence

from specstruct.errors import ConstraintError
from specstruct.constraints.schema.numeric_regex import splice
from specstruct.constraints.schema.check import prepare_schema

_WS = "\x00ws\x00"  # whitespace placeholder, resolved by json_regex
_PLAIN_CHAR = r'([^"\\\x00-\x1F\x7F-\x9F])'  # a JSON string character that needs no escape


def json_regex(schema: dict | str) -> str:
    """The regex of `schema`'s instances as `json.dumps(value, ensure_ascii=False)` writes them."""
    from outlines_core.json_schema import STRING_INNER, build_regex_from_schema

    prepared, numeric = prepare_schema(schema)
    try:
        raw = build_regex_from_schema(json.dumps(prepared), _WS)
    except (ValueError, RuntimeError) as e:
        raise ConstraintError(f"outlines_core cannot compile this JSON schema: {e}".strip()) from e
    # Every structural ',' and ':' touches a placeholder: give it exactly one space after, as json.dumps
    # does, inside whatever optional group holds it ("(, "b": ...)?"), and drop the other placeholders.
    for sep in (",", ":"):
        raw = raw.replace(_WS + sep + _WS, sep + " ").replace(_WS + sep, sep + " ").replace(sep + _WS, sep + " ")
    raw = raw.replace(STRING_INNER + "{", _PLAIN_CHAR + "{")  # only length-bounded strings are counted
    return splice(raw.replace(_WS, ""), numeric)


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
