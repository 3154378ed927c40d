"""Why a valid instance is outside a compiled schema's language: a best-effort label per documented reason
(docs/conformance.md lists them; the conformance test allows only these)."""

from __future__ import annotations

import re
from typing import Any

from specstruct.constraints.schema.logic import dict_nodes


def reason(value: Any, schema: Any, text: str, backend: str = "llguidance") -> str:
    """Best-effort label for why a valid instance is outside the automaton's language (see docs)."""
    nodes = list(dict_nodes(schema))
    if re.search(r"\d[eE][+-]?\d", text) and any({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}
                                                   & set(node) for node in nodes):
        return "exponent in a bounded number (llguidance writes bounded numbers in plain decimal form)"
    if "\x7f" in text:
        return "control character (DEL is written as \\u007f; json.dumps writes it raw)"
    if backend == "outlines":
        if re.search(r"\\u[0-9a-fA-F]{4}", text):
            return "control character (needs a \\u escape outlines_core's string regex lacks)"
        if "\\" in text and any({"minLength", "maxLength"} & set(node) for node in nodes):
            return "escape in a length-bounded string (generated without escape sequences)"
        if any("pattern" in node for node in nodes):
            return "pattern (JSON Schema searches, outlines_core matches the whole string)"
        if any(node.get("format") in ("uri", "email", "date-time", "time") for node in nodes):
            return "format (outlines_core's format regexes are narrower than the RFCs, e.g. uri is http/ftp/urn)"
    found = _undeclared(value, schema, schema)
    if found == "branch":
        return "undeclared property in a closed anyOf/oneOf branch (a branch gets only its own declared keys)"
    if found == "object":
        return "undeclared property (only declared properties are generated)"
    if backend == "outlines" and _depth(value) > 3:
        return "nesting depth (free-form JSON and $ref are unrolled to a fixed depth)"
    if found == "order":
        return "property order (properties are written in schema order)"
    declared = {k for node in nodes if isinstance(node.get("properties"), dict) for k in node["properties"]}
    required = {k for node in nodes if isinstance(node.get("required"), list) for k in node["required"]
                if isinstance(k, str)}
    if set(_keys(value)) & (required - declared):
        return "property order for keys named only in `required` (llguidance chooses their order)"
    if any(_whole_floats(node.get("const")) or any(_whole_floats(v) for v in node.get("enum") or [])
           for node in nodes):
        return "number form in an enum/const (a whole float such as 0.0 is written 0)"
    return "other"


def _whole_floats(value: Any) -> bool:
    if isinstance(value, float):
        return value.is_integer()
    if isinstance(value, dict):
        return any(_whole_floats(v) for v in value.values())
    if isinstance(value, list):
        return any(_whole_floats(v) for v in value)
    return False


def _undeclared(value: Any, node: Any, root: Any, depth: int = 0) -> str | None:
    """"object" where some object of `value` has a key its schema node neither declares nor leaves open, "branch"
    where another anyOf/oneOf branch than the one that fits best declares it, "order" where every key is declared but
    not written in the schema's order; None otherwise."""
    from specstruct.constraints.schema.normalise import follow_ref

    node = follow_ref(node, root)
    if depth > 40 or not isinstance(node, dict):
        return None
    members = [follow_ref(m, root) for m in node.get("allOf") or [] if isinstance(m, (dict, bool))]
    branches = [follow_ref(b, root) for k in ("anyOf", "oneOf") for b in node.get(k) or []]
    if isinstance(value, dict):
        props: dict[str, Any] = {}
        for part in [node] + [m for m in members if isinstance(m, dict)]:
            props.update(part.get("properties") if isinstance(part.get("properties"), dict) else {})
        best = max((b for b in branches if isinstance(b, dict)), default=None,
                   key=lambda b: len(set(value) & set(b.get("properties") or {})))
        other = {k for b in branches if isinstance(b, dict) and b is not best for k in (b.get("properties") or {})}
        if best is not None:
            props = {**(best.get("properties") or {}), **props}
        patterns = [p for part in [node] + members if isinstance(part, dict)
                    for p in (part.get("patternProperties") or {})]
        own = list(node.get("properties") or {}) if isinstance(node.get("properties"), dict) else []
        written = [k for k in value if k in own]
        order = not members and not branches and written != sorted(written, key=own.index)
        extra = node.get("additionalProperties")
        closed = any(isinstance(part, dict) and isinstance(part.get("properties"), dict)
                     for part in [node] + members + branches)
        for key, item in value.items():
            if key in props:
                found = _undeclared(item, props[key], root, depth + 1)
            elif not closed or any(_search(p, key) for p in patterns) or extra not in (None, False):
                found = None
            else:
                return "branch" if key in other else "object"
            if found in ("object", "branch"):
                return found
            order = order or found == "order"
        return "order" if order else None
    elif isinstance(value, list):
        def worst(part: dict) -> str | None:  # the least explained item under this part's `items`
            items = part.get("items")
            found = [_undeclared(item, items[i] if isinstance(items, list) and i < len(items) else items, root,
                                 depth + 1) for i, item in enumerate(value)]
            return max(found, key=_RANK.get, default=None)
        every = [worst(p) for p in [node] + members if isinstance(p, dict) and "items" in p]
        some = [worst(b) for b in branches if isinstance(b, dict) and "items" in b]
        return max(every + [min(some, key=_RANK.get)] if some else every, key=_RANK.get, default=None)
    return None


_RANK = {None: 0, "order": 1, "branch": 2, "object": 2}


def _search(pattern: str, key: str) -> bool:
    try:
        return re.search(pattern, key) is not None
    except re.error:
        return True  # a pattern Python cannot read: do not blame the key


def _keys(value: Any):
    if isinstance(value, dict):
        for k, v in value.items():
            yield k
            yield from _keys(v)
    elif isinstance(value, list):
        for v in value:
            yield from _keys(v)


def _depth(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max((_depth(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((_depth(v) for v in value), default=0)
    return 0
