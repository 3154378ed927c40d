"""A schema as the default (llguidance) backend compiles it, from a Pydantic type or a dict: nothing relaxed but
what llguidance cannot compile. (schema.normalise.relaxed is the outlines_core backend's counterpart.)"""

from __future__ import annotations

import functools
import json
from typing import Any

# Pydantic's Decimal-as-string pattern (a look-ahead: "not only signs and dots") and the same language without one.
DECIMAL_PATTERN = r"^(?!^[-+.]*$)[+-]?0*\d*\.?\d*$"
DECIMAL_EQUIVALENT = r"^[+-]?(\d+\.?\d*|\.\d+)$"


def llguidance_source(schema: Any, from_pydantic: bool = True) -> Any:
    """A schema as the llguidance backend compiles it: everything kept (anchors, bounds, formats: llguidance
    enforces them), but Pydantic's Decimal pattern becomes the same language without a look-ahead, and (for a
    Pydantic type, `from_pydantic`) any other pattern llguidance cannot compile is dropped, and so is `uniqueItems`
    (a `set` field: Pydantic merges duplicates), since the type's validator checks them after generation (and the
    API retries). A schema dict keeps them, and is refused."""
    if isinstance(schema, list):
        return [llguidance_source(v, from_pydantic) for v in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: (v if k in ("enum", "const", "default", "examples") else llguidance_source(v, from_pydantic))
           for k, v in schema.items() if not (from_pydantic and k == "uniqueItems" and isinstance(v, bool))}
    if from_pydantic and any(isinstance(out.get(b), (int, float)) for b in BOUNDS) and not _bounds_compile(out):
        for b in BOUNDS:  # beyond what llguidance builds (|x| ~ 1e18 and up, tiny non-zero): left to the validator
            if b in out and not _bounds_compile({"type": out.get("type"), b: out[b]}):
                out.pop(b)
        if not _bounds_compile(out):  # each builds alone, not together
            for b in BOUNDS:
                out.pop(b, None)
    pattern = out.get("pattern")
    if isinstance(pattern, str):
        if pattern == DECIMAL_PATTERN:
            out["pattern"] = DECIMAL_EQUIVALENT
        elif from_pydantic and not _compiles(pattern):
            del out["pattern"]
    return out


BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")


def _bounds_compile(node: dict) -> bool:
    """Whether llguidance can build this number's bounds (it writes a range as a regex: not for an int64's range,
    floats from about 1e18 up, or a bound like 1e-300)."""
    return _range_compiles(json.dumps({k: node[k] for k in ("type", *BOUNDS) if k in node}, sort_keys=True))


@functools.lru_cache(maxsize=4096)
def _range_compiles(small: str) -> bool:
    from llguidance import LLMatcher

    try:
        return not LLMatcher.validate_grammar(LLMatcher.grammar_from_json_schema(json.loads(small)))
    except (ValueError, RuntimeError):
        return False


def _compiles(pattern: str) -> bool:
    from llguidance import LLMatcher

    return not LLMatcher.validate_grammar(LLMatcher.grammar_from_regex(pattern))


def required_tags(schema: Any) -> Any:
    """A Pydantic schema (a copy) where every branch of a discriminated union requires its tag. Pydantic leaves a
    tag with a default (`kind: Literal["cat"] = "cat"`) out of `required`, yet its validator needs the tag to pick
    the branch, so without this a valid-looking object with no tag never validates."""
    defs = schema.get("$defs", {}) if isinstance(schema, dict) else {}
    todo = [schema]
    while todo:
        node = todo.pop()
        if isinstance(node, list):
            todo.extend(node)
            continue
        if not isinstance(node, dict):
            continue
        todo.extend(node.values())
        disc = node.get("discriminator")
        tag = disc.get("propertyName") if isinstance(disc, dict) else None
        for branch in (node.get("oneOf") or node.get("anyOf") or []) if tag else []:
            ref = branch.get("$ref", "") if isinstance(branch, dict) else ""
            target = defs.get(ref.removeprefix("#/$defs/")) if ref.startswith("#/$defs/") else branch
            if isinstance(target, dict) and tag in (target.get("properties") or {}):
                target["required"] = list(dict.fromkeys([*(target.get("required") or []), tag]))
    return schema
