"""Numeric bounds as regexes: what outlines_core cannot say about `minimum`/`maximum`.

outlines_core ignores `minimum`, `maximum`, `exclusiveMinimum` and `exclusiveMaximum`. For an integer
node (and a number node with integer bounds) the set of allowed JSON numerals is still regular, so we
write that regex ourselves and splice it into outlines_core's output: `mark_numeric` swaps each such
node for a `const` placeholder string, and `splice` replaces the placeholder's regex with ours.

    integer_regex(0, None)   -> (?:0|[1-9][0-9]*)          every non-negative integer
    integer_regex(-5, 12)    -> -[1-5] | 0 | [1-9] | 1[0-2]  (grouped)
    number_regex(0, 100)     -> x.y with 0 <= x < 100, or 100 / 100.0...  (no exponent form)

Bounded numbers are written without an exponent (`1e3`): a subset of the valid numerals, so sound.
"""

from __future__ import annotations

import math
from typing import Any

_KEYS = {"type", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}
_MARK = "SPECSTRUCTNUM{}X"


def _digits_from(lo: int) -> str:
    """Non-negative integers >= lo, as a regex (no leading zeros)."""
    if lo == 0:
        return "(?:0|[1-9][0-9]*)"
    s = str(lo)
    longer = f"[1-9][0-9]{{{len(s)},}}"
    return f"(?:{_same_length(s, '9' * len(s))}|{longer})"


def _between(lo: int, hi: int) -> str:
    """Non-negative integers in [lo, hi], as a regex (no leading zeros)."""
    parts = []
    for width in range(len(str(lo)), len(str(hi)) + 1):
        a = max(lo, 10 ** (width - 1) if width > 1 else 0)
        b = min(hi, 10 ** width - 1)
        if a <= b:
            parts.append(_same_length(str(a), str(b)))
    return "(?:" + "|".join(parts) + ")"


def _same_length(lo: str, hi: str) -> str:
    """Digit strings of one width between lo and hi inclusive (leading zeros allowed inside)."""
    if lo == hi:
        return lo
    if lo[0] == hi[0]:
        return lo[0] + _same_length(lo[1:], hi[1:])
    n = len(lo) - 1
    tail = f"[0-9]{{{n}}}" if n else ""
    if lo[1:] == "0" * n and hi[1:] == "9" * n:
        return f"[{lo[0]}-{hi[0]}]{tail}"
    parts = [lo[0] + _same_length(lo[1:], "9" * n)]
    if int(hi[0]) - int(lo[0]) > 1:
        parts.append(f"[{int(lo[0]) + 1}-{int(hi[0]) - 1}]{tail}")
    parts.append(hi[0] + _same_length("0" * n, hi[1:]))
    return "(?:" + "|".join(parts) + ")"


def integer_regex(lo: int | None, hi: int | None) -> str:
    """JSON integers n with lo <= n <= hi (None: unbounded)."""
    if lo is not None and hi is not None and lo > hi:
        raise ValueError(f"empty integer range [{lo}, {hi}]")
    parts = []
    if hi is None or hi >= 0:  # the non-negative side
        a = max(lo, 0) if lo is not None else 0
        parts.append(_digits_from(a) if hi is None else _between(a, hi))
    if lo is None or lo < 0:  # the negative side: -m with m in [max(1, -hi), -lo]
        a = max(1, -hi) if hi is not None else 1
        parts.append("-" + (_digits_from(a) if lo is None else _between(a, -lo)))
    return "(?:" + "|".join(parts) + ")"


def number_regex(lo: int | None, hi: int | None) -> str:
    """JSON numbers x with lo <= x <= hi for integer bounds, written without an exponent."""
    frac = r"(?:\.[0-9]+)?"
    zeros = r"(?:\.0+)?"
    parts = []
    if hi is None:
        if lo is not None and lo >= 0:
            return f"(?:{_digits_from(lo)}{frac})"
        parts.append(f"{_digits_from(0)}{frac}")
        if lo is None:
            parts.append(f"-{_digits_from(0)}{frac}")
        else:  # lo < 0: -m.f with m.f <= -lo  ->  m < -lo with any fraction, or m == -lo exactly
            parts.append(f"-(?:{_between(0, -lo - 1)}{frac}|{-lo}{zeros})")
        return "(?:" + "|".join(parts) + ")"
    if lo is None:
        return _mirror(hi)
    if lo > hi:
        raise ValueError(f"empty number range [{lo}, {hi}]")
    if lo >= 0:
        below = _between(lo, hi - 1) + frac if hi > lo else None
        return "(?:" + "|".join(p for p in (below, f"{hi}{zeros}") if p) + ")"
    if hi <= 0:
        above = "-" + _between(-hi, -lo - 1) + frac if -lo > -hi else None
        edge = f"-{-lo}{zeros}"
        zero_edge = f"0{zeros}" if hi == 0 else None
        return "(?:" + "|".join(p for p in (above, edge, zero_edge) if p) + ")"
    return "(?:" + number_regex(0, hi)[3:-1] + "|" + number_regex(lo, 0)[3:-1] + ")"


def _mirror(hi: int) -> str:
    """Numbers x <= hi (no lower bound)."""
    frac = r"(?:\.[0-9]+)?"
    if hi < 0:  # x <= hi < 0  <=>  x = -m.f with m.f >= -hi
        return f"(?:-{_digits_from(-hi)}{frac})"
    neg = f"-{_digits_from(0)}{frac}"
    return "(?:" + neg + "|" + number_regex(0, hi)[3:-1] + ")"


def _bounds(node: dict, integer: bool) -> tuple[Any, Any] | None:
    lo, hi = node.get("minimum"), node.get("maximum")
    xlo, xhi = node.get("exclusiveMinimum"), node.get("exclusiveMaximum")
    if isinstance(xlo, bool) or isinstance(xhi, bool):  # draft 4: booleans modify minimum/maximum
        if (xlo and lo is not None and not integer) or (xhi and hi is not None and not integer):
            return None
        lo = lo + 1 if xlo and lo is not None else lo
        hi = hi - 1 if xhi and hi is not None else hi
    else:
        if xlo is not None:
            if not integer:
                return None
            lo = max(lo, math.floor(xlo) + 1) if lo is not None else math.floor(xlo) + 1
        if xhi is not None:
            if not integer:
                return None
            hi = min(hi, math.ceil(xhi) - 1) if hi is not None else math.ceil(xhi) - 1
    for v in (lo, hi):
        if v is not None and not isinstance(v, (int, float)):
            return None
    if integer:
        lo = math.ceil(lo) if lo is not None else None
        hi = math.floor(hi) if hi is not None else None
    elif any(v is not None and float(v) != int(v) for v in (lo, hi)):
        return None  # fractional bounds on a number: not expressed
    return (int(lo) if lo is not None else None, int(hi) if hi is not None else None)


def expressible(node: dict) -> bool:
    """True when `node` is an integer/number schema whose bounds this module writes as a regex."""
    kind = node.get("type")
    return (kind in ("integer", "number") and set(node) <= _KEYS
            and _bounds(node, kind == "integer") is not None)


def mark_numeric(node: Any, markers: dict[str, str]) -> Any:
    """Replace every integer/number node with expressible bounds by a const placeholder (recursively)."""
    if isinstance(node, list):
        return [mark_numeric(v, markers) for v in node]
    if not isinstance(node, dict):
        return node
    kind = node.get("type")
    if kind in ("integer", "number") and set(node) <= _KEYS and set(node) & (_KEYS - {"type"}):
        bounds = _bounds(node, kind == "integer")
        if bounds is not None:
            try:
                regex = (integer_regex if kind == "integer" else number_regex)(*bounds)
            except ValueError:
                return node  # empty range: outlines_core's error path reports it
            mark = _MARK.format(len(markers))
            markers[mark] = regex
            return {"const": mark}
    out = {}
    for k, v in node.items():
        if k in ("enum", "const"):
            out[k] = v
        elif k in ("properties", "$defs", "definitions", "patternProperties", "dependentSchemas") and isinstance(v, dict):
            out[k] = {name: mark_numeric(s, markers) for name, s in v.items()}
        else:
            out[k] = mark_numeric(v, markers) if isinstance(v, (dict, list)) else v
    return out


def splice(regex: str, markers: dict[str, str]) -> str:
    """Put the numeric regexes where outlines_core wrote the placeholders' JSON strings."""
    for mark, sub in markers.items():
        regex = regex.replace(f'"{mark}"', sub)
    return regex
