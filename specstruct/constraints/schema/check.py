"""Which JSON-schema keywords specstruct can *guarantee*.

outlines_core turns a schema into a regex by dispatching on ONE keyword per node, in the order
`properties, allOf, anyOf, oneOf, prefixItems, enum, const, $ref, type`, and silently ignores whatever
else the node says. A keyword it ignores while it constrains instances (`minimum`, `not`,
`uniqueItems`, a sibling of `$ref`, ...) would let the model emit JSON that fails the schema, so
`prepare_schema` raises ConstraintError naming the keyword and its JSON path instead. The schema is
first normalised (normalise.py) so that as much as possible is expressible.
"""

from __future__ import annotations

import json
from typing import Any

from specstruct.errors import ConstraintError
from specstruct.constraints.schema.numeric_regex import mark_numeric
from specstruct.constraints.schema.normalise import (json_safe_pattern, ANY_TYPE, BY_TYPE, CONTAINERS, DISPATCH,
                                                     NEVER, normalise)


def unsupported(keyword: str, path: str, why: str) -> ConstraintError:
    return ConstraintError(
        f"unsupported JSON-schema keyword '{keyword}' at {path}: {why}. specstruct never falls back to "
        "unconstrained output; remove or rewrite it (validate it after generation with a Pydantic "
        "validator instead)."
    )


def prepare_schema(schema: Any) -> tuple[dict, dict[str, str]]:
    """A normalised copy of `schema` that outlines_core compiles faithfully, plus the numeric regexes to
    splice in for the const placeholders it holds (numeric_regex.py); or raise ConstraintError."""
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as e:
            raise ConstraintError(f"the JSON schema is not valid JSON: {e}") from e
    if schema is True:
        schema = {}
    if not isinstance(schema, dict):
        raise ConstraintError(f"a JSON schema must be an object, got {type(schema).__name__}; pass a dict.")
    numeric: dict[str, str] = {}
    root = mark_numeric(normalise(schema), numeric)
    _Checker(root).check(root, "#")
    return root, numeric


class _Checker:
    """Walks the nodes reachable from the root (following local $refs once) and raises on the first
    keyword outlines_core would ignore."""

    def __init__(self, root: dict):
        self.root = root
        self.seen_refs: set[str] = set()

    def check(self, node: Any, path: str) -> None:
        if node is False:
            raise ConstraintError(f"the schema at {path} is `false`: no value can satisfy it; remove it.")
        if not isinstance(node, dict) or not node:
            return
        head = next((k for k in DISPATCH if k in node), None)
        for key in node:
            if key in NEVER and (head != "type" or key in ANY_TYPE):
                raise unsupported(key, path, "outlines_core cannot express it, so the output would not be "
                                  "guaranteed to satisfy it")
        if head is None:
            constraining = sorted(set(node) - CONTAINERS - {"$id"})
            if constraining:
                raise unsupported(constraining[0], path, "a schema node without 'type' (or properties/"
                                  "anyOf/enum/const/$ref) cannot be compiled; add a 'type'")
            return
        getattr(self, "_" + head.lstrip("$").lower())(node, path)

    def _others(self, node: dict, path: str, allowed: set[str], head: str) -> None:
        extra = sorted(set(node) - allowed - CONTAINERS - {"$id", head})
        if extra:
            raise unsupported(extra[0], path, f"outlines_core ignores it next to '{head}'")

    def _properties(self, node: dict, path: str) -> None:
        props = node["properties"]
        self._others(node, path, {"required", "type", "minProperties", "maxProperties"}, "properties")
        types = node.get("type", "object")
        if "object" not in (types if isinstance(types, list) else [types]):
            raise unsupported("type", path, "'properties' always produces an object")
        required = [r for r in node.get("required", []) if isinstance(r, str)]
        missing = [r for r in required if r not in props]
        if missing:
            raise unsupported("required", path, f"required property {missing[0]!r} is not declared in "
                              "'properties', so it would never be generated; declare it")
        if node.get("minProperties", 0) > len(set(required)):
            raise unsupported("minProperties", path, "only the required properties are guaranteed")
        if node.get("maxProperties", len(props)) < len(props):
            raise unsupported("maxProperties", path, "optional properties could exceed it")
        for name, sub in props.items():
            self.check(sub, f"{path}/properties/{name}")

    def _allof(self, node: dict, path: str) -> None:
        parts = node["allOf"]
        if not isinstance(parts, list) or len(parts) != 1:
            raise unsupported("allOf", path, "outlines_core concatenates the subschemas instead of "
                              "intersecting them; merge them into one schema")
        self._others(node, path, set(), "allOf")
        self.check(parts[0], f"{path}/allOf/0")

    def _anyof(self, node: dict, path: str, key: str = "anyOf") -> None:
        self._others(node, path, set(), key)
        for i, sub in enumerate(node[key] if isinstance(node[key], list) else []):
            self.check(sub, f"{path}/{key}/{i}")

    def _oneof(self, node: dict, path: str) -> None:
        self._anyof(node, path, "oneOf")  # compiled as anyOf: see docs/conformance.md

    def _prefixitems(self, node: dict, path: str) -> None:
        n = len(node["prefixItems"])
        self._others(node, path, {"type", "items", "minItems", "maxItems"}, "prefixItems")
        if node.get("minItems", 0) > n or node.get("maxItems", n) < n:
            raise unsupported("minItems" if node.get("minItems", 0) > n else "maxItems", path,
                              "outlines_core emits exactly the prefixItems")
        for i, sub in enumerate(node["prefixItems"]):
            self.check(sub, f"{path}/prefixItems/{i}")

    def _enum(self, node: dict, path: str, key: str = "enum") -> None:
        values = node[key] if key == "enum" else [node[key]]
        if not isinstance(values, list) or not values:
            raise ConstraintError(f"'{key}' at {path} lists no value, so nothing can satisfy it; add values.")
        rest = {k: v for k, v in node.items() if k not in (key, "$id") and k not in CONTAINERS}
        if rest:  # outlines_core ignores the siblings: every listed value must satisfy them on its own
            import jsonschema

            probe = {**rest, **{k: v for k, v in self.root.items() if k in CONTAINERS}}
            for value in values:
                if not jsonschema.Draft202012Validator(probe).is_valid(value):
                    raise unsupported(sorted(rest)[0], path, f"the {key} value {value!r} violates it, "
                                      f"and outlines_core would still emit that value")

    def _const(self, node: dict, path: str) -> None:
        self._enum(node, path, "const")

    def _ref(self, node: dict, path: str) -> None:
        self._others(node, path, set(), "$ref")
        ref = node["$ref"]
        if not isinstance(ref, str) or ref in self.seen_refs:
            return
        self.seen_refs.add(ref)
        target: Any = self.root
        if "#" in ref:
            for part in (p for p in ref.split("#", 1)[1].split("/") if p):
                part = part.replace("~1", "/").replace("~0", "~")
                if not isinstance(target, dict) or part not in target:
                    return  # outlines_core reports the broken reference itself
                target = target[part]
            self.check(target, ref)

    def _type(self, node: dict, path: str) -> None:
        types = node["type"] if isinstance(node["type"], list) else [node["type"]]
        for t in types:
            if t not in BY_TYPE:
                raise unsupported("type", path, f"unknown type {t!r}")
        relevant = set().union(*(BY_TYPE[t] for t in types))
        for key in sorted(set(node) & relevant):
            self._type_keyword(node, key, path)
        if isinstance(node.get("items"), dict) and "array" in types:
            self.check(node["items"], f"{path}/items")
        if isinstance(node.get("additionalProperties"), dict) and "object" in types:
            self.check(node["additionalProperties"], f"{path}/additionalProperties")

    def _type_keyword(self, node: dict, key: str, path: str) -> None:
        if key in NEVER or key in ("uniqueItems", "patternProperties"):
            raise unsupported(key, path, "outlines_core cannot express it")
        if key == "required" and node[key]:
            raise unsupported(key, path, "an object without 'properties' cannot force named keys; "
                              "declare them in 'properties'")
        if key == "items" and not isinstance(node[key], dict):
            raise unsupported(key, path, "the tuple form of 'items' is not supported; use 'prefixItems'")
        length = {"minLength", "maxLength"} & set(node)
        if key in ("pattern", "format") and length:
            raise unsupported(sorted(length)[0], path, f"outlines_core drops '{key}' when a length bound "
                              "is present; keep one of them")
        if key == "format" and "pattern" in node:
            raise unsupported("format", path, "outlines_core drops 'format' next to 'pattern'")
        if key == "pattern" and isinstance(node[key], str):
            from llguidance import LLMatcher

            error = LLMatcher.validate_grammar(LLMatcher.grammar_from_regex(node[key]))
            if error:
                detail = error.strip().splitlines()[-3] if error.count("\n") >= 3 else error.strip()
                raise unsupported("pattern", path, f"{node[key]!r} is not a supported regex ({detail.strip()}; "
                                  "Rust syntax, no look-around or back-references)")
        if key == "pattern" and isinstance(node[key], str) and not json_safe_pattern(node[key]):
            raise unsupported("pattern", path, f"{node[key]!r} can match '\"', '\\\\' or a control "
                              "character, which a JSON string must escape; exclude them from the pattern, "
                              "e.g. [^\"\\\\]* instead of .*")
