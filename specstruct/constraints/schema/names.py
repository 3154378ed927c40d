"""`propertyNames`, which llguidance does not implement, as the object keywords it does, where that is exact.

Pydantic writes it for every dict keyed by a Literal or an Enum (`dict[Literal["a", "b"], int]` has
`"propertyNames": {"enum": ["a", "b"]}`), and for dict[int, ...] specstruct adds a pattern (types/output.py); without
this those types were refused. On an object node:

- `propertyNames: {enum: [...]}` (or `const`): the listed keys become optional `properties` with the schema each
  key had (its declared property, else the `patternProperties` it matches, else `additionalProperties`), and no
  other key is allowed;
- `propertyNames: {pattern: P}` on an object without `patternProperties`: the keys it declares that P does not
  match are dropped (a required one makes the schema empty, as it is), and every other key must match P
  (`patternProperties: {P: <additionalProperties>}`, `additionalProperties: false`); only when a declared key's
  own schema would not also have to satisfy `additionalProperties` (that is `{}` or `true`), or nothing is declared;
- `propertyNames: true` / `{}` goes; `false` allows only `{}` (`maxProperties: 0`).

Anything else (a `not`, a `format`, lengths, patternProperties next to a name pattern) is left in place and refused
by llguidance with the keyword's path, as before.
"""

from __future__ import annotations

import re
from typing import Any

from specstruct.constraints.schema.branches import deref
from specstruct.constraints.schema.logic import dict_nodes

DATA = ("enum", "const", "default", "examples")
PLAIN = {"type", "title", "description", "$comment"}


def rewrite_property_names(schema: Any) -> Any:
    """`schema` with every exactly expressible `propertyNames` rewritten in place (see the module docstring)."""
    for node in dict_nodes(schema, skip=DATA):
        if "propertyNames" in node:
            _rewrite(node, schema)
    return schema


def _rewrite(node: dict, root: Any) -> None:
    names = node["propertyNames"]
    if isinstance(names, dict) and "$ref" in names and set(names) - PLAIN - {"$ref"}:
        return  # keywords next to the $ref also hold: not rewritten (refused by llguidance, by name)
    names = deref(root, names)  # an Enum key is a $ref to the Enum's definition
    if names is True or names == {}:
        del node["propertyNames"]
    elif names is False:
        del node["propertyNames"]
        node["maxProperties"] = 0
    elif isinstance(names, dict) and names.get("type", "string") == "string":
        keys = _listed(names)
        if keys is not None:
            _to_properties(node, keys)
        elif set(names) <= PLAIN | {"pattern"} and "pattern" in names and not node.get("patternProperties"):
            _to_pattern(node, names["pattern"])


def _listed(names: dict) -> list[str] | None:
    """The keys an `enum`/`const` propertyNames allows (in order, strings only), or None for another form."""
    if not set(names) <= PLAIN | {"enum", "const"} or ("enum" in names) == ("const" in names):
        return None
    values = names["enum"] if "enum" in names else [names["const"]]
    return list(dict.fromkeys(v for v in values if isinstance(v, str))) if isinstance(values, list) else None


def _to_properties(node: dict, keys: list[str]) -> None:
    props, patterns = node.get("properties", {}), node.get("patternProperties", {})
    extra = node.get("additionalProperties", True)
    new = {}
    for key in [k for k in props if k in keys] + [k for k in keys if k not in props]:
        try:
            schemas = [props[key]] if key in props else []
            schemas += [s for p, s in patterns.items() if re.search(p, key)]
        except re.error:
            return  # a pattern Python's `re` cannot read: leave it to llguidance, which refuses propertyNames
        if not schemas and extra is not False:
            schemas = [{} if extra is True else extra]
        if schemas:
            new[key] = schemas[0] if len(schemas) == 1 else {"allOf": schemas}
    node["properties"] = new
    node["additionalProperties"] = False
    node.pop("patternProperties", None)
    del node["propertyNames"]


def _to_pattern(node: dict, pattern: str) -> None:
    extra = node.get("additionalProperties", True)
    props = node.get("properties", {})
    if props and extra not in (True, {}):
        return  # a declared key would have to satisfy both its schema and additionalProperties
    try:
        kept = {k: v for k, v in props.items() if re.search(pattern, k)}
    except re.error:
        return
    if props:
        node["properties"] = kept
    if extra is not False:
        node["patternProperties"] = {pattern: {} if extra is True else extra}
    node["additionalProperties"] = False
    del node["propertyNames"]
