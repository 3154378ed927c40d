"""Normalise a JSON schema so that outlines_core compiles it faithfully (all rewrites are sound: every
output of the rewritten schema still satisfies the original one).

- annotations (title, description, default, examples, unknown `x-*` keys, ...) are dropped;
- `true` and `{}` subschemas become an explicit anyOf of the six JSON types (outlines_core's own
  regex for `{}` misses a group and binds a property key to `true|false` only);
- `allOf` subschemas are merged into one schema when they combine cleanly (properties and required
  united, types intersected, the tighter of two bounds kept); otherwise allOf stays and is refused;
- constraints written next to `anyOf`/`oneOf` are merged into every branch, so outlines_core sees them;
- `additionalProperties: false` without `properties` becomes `maxProperties: 0`; `properties: {}`
  without `required` is dropped (a free-form object); with `properties`, outlines_core emits only the
  declared ones, so `additionalProperties`/`patternProperties` go;
- `pattern` anchors `^...$` are removed (outlines_core matches the whole string anyway);
- `format` values outlines_core cannot express are dropped: JSON Schema defines `format` as an
  annotation unless a validator opts in, so instances stay valid.
"""

from __future__ import annotations

import copy
from typing import Any

from specstruct.constraints.schema.numeric_regex import expressible

SUPPORTED_FORMATS = {"date-time", "date", "time", "uuid", "uri", "email"}
DISPATCH = ("properties", "allOf", "anyOf", "oneOf", "prefixItems", "enum", "const", "$ref", "type")
# Keywords that constrain instances but that outlines_core never enforces anywhere.
NEVER = {"not", "if", "then", "else", "dependencies", "dependentRequired", "dependentSchemas",
         "unevaluatedProperties", "unevaluatedItems", "contains", "minContains", "maxContains",
         "propertyNames", "multipleOf", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
         "$dynamicRef", "$recursiveRef", "additionalItems"}
ANY_TYPE = {"not", "if", "then", "else", "$dynamicRef", "$recursiveRef"}  # constrain every type
CONTAINERS = {"$defs", "definitions"}
KNOWN = set(DISPATCH) | NEVER | CONTAINERS | {
    "required", "additionalProperties", "patternProperties", "minProperties", "maxProperties",
    "items", "minItems", "maxItems", "uniqueItems", "minLength", "maxLength", "pattern", "format",
    "minDigits", "maxDigits", "minDigitsInteger", "maxDigitsInteger", "minDigitsFraction",
    "maxDigitsFraction", "minDigitsExponent", "maxDigitsExponent",
}
# Per instance type: the keywords outlines_core honours on a `type` node.
BY_TYPE = {
    "string": {"minLength", "maxLength", "pattern", "format"},
    "integer": {"minDigits", "maxDigits", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
                "multipleOf"},
    "number": {"minDigitsInteger", "maxDigitsInteger", "minDigitsFraction", "maxDigitsFraction",
               "minDigitsExponent", "maxDigitsExponent", "minimum", "maximum", "exclusiveMinimum",
               "exclusiveMaximum", "multipleOf"},
    "array": {"items", "minItems", "maxItems", "uniqueItems", "contains", "minContains", "maxContains",
              "additionalItems", "prefixItems", "unevaluatedItems"},
    "object": {"additionalProperties", "minProperties", "maxProperties", "required", "patternProperties",
               "propertyNames", "dependencies", "dependentRequired", "dependentSchemas",
               "unevaluatedProperties", "properties"},
    "boolean": set(),
    "null": set(),
}


# "Any JSON value", spelled so outlines_core wraps the alternation in a group.
ANY_VALUE = {"anyOf": [{"type": t} for t in ("string", "number", "boolean", "null", "object", "array")]}
# Value bounds a Pydantic type re-checks after generation (the API retries on failure).
RELAXABLE = {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf", "uniqueItems"}
_LOWER = {"minLength", "minItems", "minProperties", "minimum", "exclusiveMinimum"}
_UPPER = {"maxLength", "maxItems", "maxProperties", "maximum", "exclusiveMaximum"}
_MAX_DEPTH = 48  # stop folding inside deeply recursive schemas


def normalise(schema: Any, drop: set[str] | frozenset = frozenset()) -> Any:
    """The normalised copy of `schema`; keywords in `drop` are removed everywhere."""
    root = copy.deepcopy(schema)
    return _normalise(root, root, drop, is_root=True)


def relaxed(schema: dict) -> dict:
    """`schema` without the value bounds listed in RELAXABLE that no regex expresses (and without string
    length bounds where a pattern or format is present): for types whose own validator checks them after
    generation. Integer/number bounds numeric_regex.py can write are kept, so they are guaranteed."""
    return _relax(normalise(schema))


def _relax(node: Any) -> Any:

    if isinstance(node, list):
        return [_relax(v) for v in node]
    if not isinstance(node, dict) or expressible(node):
        return node
    out = {}
    for k, v in node.items():
        if k in RELAXABLE:
            continue
        if k in ("enum", "const"):
            out[k] = v
        elif k in ("properties", "$defs", "definitions", "patternProperties") and isinstance(v, dict):
            out[k] = {name: _relax(s) for name, s in v.items()}
        else:
            out[k] = _relax(v)
    if isinstance(out.get("pattern"), str) and not _usable_pattern(out["pattern"]):
        del out["pattern"]  # e.g. Decimal's look-ahead: the type's validator still checks it
    if "pattern" in out or "format" in out:
        out.pop("minLength", None)
        out.pop("maxLength", None)
    return out


def _usable_pattern(pattern: str) -> bool:
    """A pattern outlines_core can compile (Rust syntax, no look-around) that stays inside a JSON string."""
    from llguidance import LLMatcher


    return not LLMatcher.validate_grammar(LLMatcher.grammar_from_regex(pattern)) and json_safe_pattern(pattern)


def _normalise(node: Any, root: Any, drop, is_root: bool = False, depth: int = 0) -> Any:
    if node is True:
        node = {}
    if not isinstance(node, dict):
        return node
    if depth < _MAX_DEPTH:
        node = _fold(node, root)

    def sub(v: Any) -> Any:
        return _normalise(v, root, drop, depth=depth + 1)

    out: dict[str, Any] = {}
    for key, value in node.items():
        if (key not in KNOWN and not (is_root and key == "$id")) or key in drop:
            continue  # an annotation or an unknown keyword: validators ignore it too
        if key in ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas"):
            if isinstance(value, dict):
                value = {k: sub(v) for k, v in value.items()}
        elif key in ("items", "additionalProperties", "not", "if", "then", "else", "contains",
                     "propertyNames", "additionalItems", "unevaluatedProperties", "unevaluatedItems",
                     "allOf", "anyOf", "oneOf", "prefixItems"):
            value = [sub(v) for v in value] if isinstance(value, list) else sub(value)
        out[key] = value
    if out.get("uniqueItems") is False:
        del out["uniqueItems"]
    if isinstance(out.get("pattern"), str):
        out["pattern"] = _strip_anchors(out["pattern"])
    if isinstance(out.get("format"), str) and out["format"] not in SUPPORTED_FORMATS:
        del out["format"]
    if out.get("properties") == {} and not out.get("required"):
        del out["properties"]  # no declared property: a free-form object, not only `{}`
    if out.get("additionalProperties") in (True, {}, ANY_VALUE):
        del out["additionalProperties"]
    if "properties" in out:
        out.pop("additionalProperties", None)  # outlines_core emits only the declared properties
        out.pop("patternProperties", None)     # ... so extra keys never appear: sound
    elif out.get("additionalProperties") is False:
        del out["additionalProperties"]
        out["maxProperties"] = 0
    if not set(out) - CONTAINERS - {"$id"}:
        out.update(copy.deepcopy(ANY_VALUE))  # outlines_core's own `{}` regex lacks a group around its '|'
    return out


def _fold(node: dict, root: Any) -> dict:
    """Merge allOf members into the node, then the node's other constraints into each anyOf/oneOf
    branch. Returns the node unchanged where a merge is not clean (the checker then refuses it)."""
    if isinstance(node.get("allOf"), list):
        merged: dict | None = {k: v for k, v in node.items() if k != "allOf"}
        for member in node["allOf"]:
            member = _deref(member, root)
            if member is True:
                continue
            merged = _merge(merged, _fold(member, root)) if isinstance(member, dict) else None
            if merged is None:
                return node
        node = {**{k: v for k, v in node.items() if k in CONTAINERS or k == "$id"}, **merged}
    for key in ("anyOf", "oneOf"):
        if not isinstance(node.get(key), list):
            continue
        siblings = {k: v for k, v in node.items() if k != key and k in KNOWN and k not in CONTAINERS}
        if not siblings:
            break
        branches = []
        for branch in node[key]:
            branch = _deref(branch, root)
            merged = _merge(siblings, {} if branch is True else branch) if isinstance(branch, (dict, bool)) else None
            if merged is None or branch is False:
                return node
            branches.append(merged)
        node = {k: v for k, v in node.items() if k not in siblings} | {key: branches}
        break
    return node


def follow_ref(node: Any, root: Any, hops: int = 10) -> Any:
    """The node a local `$ref` ("#/a/b", JSON-pointer escapes) points to, following chains up to `hops`;
    a node without a local $ref is returned as is, a pointer to nowhere gives None."""
    for _ in range(hops):
        if not (isinstance(node, dict) and isinstance(node.get("$ref"), str) and node["$ref"].startswith("#")):
            return node
        target = root
        for part in (p for p in node["$ref"][1:].split("/") if p):
            target = target.get(part.replace("~1", "/").replace("~0", "~")) if isinstance(target, dict) else None
        node = target
    return node


def _deref(node: Any, root: Any) -> Any:
    """Follow a local `$ref` (with nothing but annotations beside it), up to a few hops."""
    for _ in range(8):
        if not (isinstance(node, dict) and isinstance(node.get("$ref"), str)):
            return node
        if any(k in KNOWN and k != "$ref" for k in node):
            return node
        target = follow_ref({"$ref": node["$ref"]}, root, hops=1)
        if target is None or target is node:
            return node
        node = target
    return node


def _merge(a: dict, b: dict) -> dict | None:
    """One schema meaning `a AND b`, or None when that cannot be written without allOf."""
    a = {k: v for k, v in a.items() if k in KNOWN and k not in CONTAINERS}
    b = {k: v for k, v in b.items() if k in KNOWN and k not in CONTAINERS}
    if "$ref" in a or "$ref" in b or not (_extra_ok(a, b) and _extra_ok(b, a)):
        return None
    out = dict(a)
    for k, v in b.items():
        w = out.get(k)
        if k not in out or w == v:
            out[k] = v
        elif k == "properties" and isinstance(w, dict) and isinstance(v, dict):
            props = dict(w)
            for name, schema in v.items():
                if name in props and props[name] != schema:
                    both = _merge(props[name], schema) if isinstance(props[name], dict) and isinstance(schema, dict) else None
                    if both is None:
                        return None
                    props[name] = both
                else:
                    props[name] = schema
            out[k] = props
        elif k == "required" and isinstance(w, list) and isinstance(v, list):
            out[k] = list(dict.fromkeys([*w, *v]))
        elif k == "type":
            ta, tb = set(w if isinstance(w, list) else [w]), set(v if isinstance(v, list) else [v])
            both = ta & tb  # an integer is a number, so integer AND number is integer
            if ("integer" in ta and "number" in tb) or ("number" in ta and "integer" in tb):
                both.add("integer")
            if not both:
                return None
            out[k] = sorted(both) if len(both) > 1 else both.pop()
        elif k == "enum" and isinstance(w, list) and isinstance(v, list):
            out[k] = [x for x in w if x in v]
        elif k in _LOWER and isinstance(w, (int, float)) and isinstance(v, (int, float)):
            out[k] = max(w, v)
        elif k in _UPPER and isinstance(w, (int, float)) and isinstance(v, (int, float)):
            out[k] = min(w, v)
        elif k == "items" and isinstance(w, dict) and isinstance(v, dict):
            out[k] = _merge(w, v)
            if out[k] is None:
                return None
        else:
            return None
    return out


def _extra_ok(a: dict, b: dict) -> bool:
    """a's additionalProperties still holds once b's properties join the merged object."""
    extra = set(b.get("properties") or {}) - set(a.get("properties") or {})
    return not extra or a.get("additionalProperties", True) in (True, {})


def _strip_anchors(pattern: str) -> str:
    if pattern.startswith("^"):
        pattern = pattern[1:]
    if pattern.endswith("$") and not pattern.endswith("\\$"):
        pattern = pattern[:-1]
    return pattern


def json_safe_pattern(pattern: str) -> bool:
    """True when no string matching `pattern` contains a byte that must be escaped inside a JSON string.
    outlines_core inserts the pattern verbatim between quotes, so such a byte would break the JSON."""
    from outlines_core import Index, Vocabulary

    vocab = Vocabulary(256, {bytes([b]): [b] for b in range(256)})
    try:
        index = Index(pattern, vocab)
    except (ValueError, RuntimeError):
        return True  # not compilable at all: compile_constraint reports that error precisely
    bad = set(range(0x20)) | {0x22, 0x5C}
    return not any(bad & set(edges) for edges in index.get_transitions().values())
