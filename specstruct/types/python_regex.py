"""A compiled Python pattern (`ss.Regex(re.compile(p, flags))`) in the Rust regex syntax the constraint compilers
read, meaning what Python means by it: its flags inline, verbose classes and re.ASCII classes spelled out."""

from __future__ import annotations

import re

from specstruct.errors import ConstraintError

_FLAGS = {re.IGNORECASE: "i", re.DOTALL: "s", re.VERBOSE: "x"}
# re.ASCII, as Unicode classes (Rust's `(?-u)` would also make `.` and negated classes match lone bytes)
_ASCII = {"\\d": "0-9", "\\w": "0-9A-Za-z_", "\\s": "\\t\\n\\x0b\\x0c\\r\\x20"}  # \\x20: (?x) skips a bare space
_ASCII_NOT = {"\\D": "\\d", "\\W": "\\w", "\\S": "\\s"}


def rust_pattern(compiled: re.Pattern) -> str:
    """A compiled pattern's text with its flags written in Rust syntax (`(?i)`, `(?s)`, `(?x)`; re.ASCII as ASCII
    classes); dropped, they let the output fail the user's own regex. re.MULTILINE has no whole-text meaning."""
    flags = compiled.flags & ~(re.UNICODE | getattr(re, "NOFLAG", 0))
    if not isinstance(compiled.pattern, str):
        return compiled.pattern  # bytes: refused below
    if flags & re.MULTILINE:
        raise ConstraintError("ss.Regex matches the whole output, so re.MULTILINE (line anchors) has no meaning "
                              "here; drop the flag, or write the lines out in the pattern")
    unknown = flags & ~(sum(_FLAGS) | re.ASCII)
    if unknown:
        raise ConstraintError(f"ss.Regex cannot honour the flags {re.RegexFlag(unknown)!r} of this compiled "
                              "pattern; write the pattern without them")
    inline = "".join(f"(?{code})" for flag, code in _FLAGS.items() if flags & flag)
    return inline + _rewritten(compiled.pattern, verbose=bool(flags & re.VERBOSE), ascii=bool(flags & re.ASCII))


def _rewritten(pattern: str, verbose: bool, ascii: bool) -> str:
    """Python's meaning in Rust's syntax: in a verbose pattern, whitespace and `#` inside a class are literal in
    Python but skipped by Rust (escaped here); with re.ASCII, `\\d` `\\w` `\\s` (and their negations) are ASCII."""
    from specstruct.constraints.compiler import _scan

    out, last = [], 0
    for at, atom, in_class, _ in _scan(pattern):
        out.append(pattern[last:at])  # what the scan steps over without an atom (a class's leading ^ or ])
        last = at + len(atom)
        if verbose and in_class and (atom.isspace() or atom == "#"):
            out.append(f"\\x{ord(atom):02x}")
        elif ascii and atom in _ASCII:
            out.append(_ASCII[atom] if in_class else f"[{_ASCII[atom]}]")
        elif ascii and atom in _ASCII_NOT:
            if in_class:
                raise ConstraintError(f"ss.Regex: re.ASCII with {atom} inside a character class has no equivalent "
                                      "here; write the class out (e.g. [^0-9] for \\D)")
            out.append(f"[^{_ASCII[_ASCII_NOT[atom]]}]")
        elif ascii and atom in ("\\b", "\\B"):
            out.append(f"(?-u:{atom})")
        else:
            out.append(atom)
    return "".join(out) + pattern[last:]
