"""Why a valid instance is outside a compiled schema's language: a best-effort label per documented reason
(docs/conformance.md lists them; the conformance test allows only these)."""

from __future__ import annotations

import json
import re
from typing import Any


def reason(value: Any, schema: Any, text: str) -> str:
    """Best-effort label for why a valid instance is outside the automaton's language (see docs)."""
    declared = set(re.findall(r'"properties": \{"([^"]+)"', json.dumps(schema)))
    for node in _walk_schema(schema):
        if isinstance(node.get("properties"), dict):
            declared |= set(node["properties"])
    keys = set(_keys(value))
    if re.search(r"\d[eE][+-]?\d", text) and any({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}
                                                   & set(node) for node in _walk_schema(schema)):
        return "exponent in a bounded number (llguidance writes bounded numbers in plain decimal form)"
    if "\x7f" in text:
        return "control character (DEL is written as \\u007f; json.dumps writes it raw)"
    if re.search(r"\\u[0-9a-fA-F]{4}", text):
        return "control character (needs a \\u escape outlines_core's string regex lacks)"
    if "\\" in text and any({"minLength", "maxLength"} & set(node) for node in _walk_schema(schema)):
        return "escape in a length-bounded string (generated without escape sequences)"
    if any("pattern" in node for node in _walk_schema(schema)):
        return "pattern (JSON Schema searches, outlines_core matches the whole string)"
    if any(node.get("format") in ("uri", "email", "date-time", "time") for node in _walk_schema(schema)):
        return "format (outlines_core's format regexes are narrower than the RFCs, e.g. uri is http/ftp/urn)"
    if keys - declared and any(isinstance(node.get("properties"), dict) for node in _walk_schema(schema)):
        return "undeclared property (only declared properties are generated)"
    if _depth(value) > 3:
        return "nesting depth (free-form JSON and $ref are unrolled to a fixed depth)"
    return "other"


def _walk_schema(node: Any):
    if isinstance(node, dict):
        yield node
        for v in node.values():
            yield from _walk_schema(v)
    elif isinstance(node, list):
        for v in node:
            yield from _walk_schema(v)


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
