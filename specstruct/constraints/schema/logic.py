"""Rewrite negation (`not`) and `dependencies` into equivalent positive schemas, which llguidance enforces.

llguidance has no `not`, `dependencies`, `dependentRequired` or `dependentSchemas`. Many of their uses have an
exact positive equivalent under JSON Schema semantics: `not {type: null}` is `type` of the other five types,
`not {required: [k]}` is `properties: {k: false}`, `dependencies {a: [b]}` is "a absent, or a and b present",
De Morgan moves `not` inside `anyOf`/`allOf`. Each rewrite here is exact (the same instances validate); a form
without an exact rewrite is left in place, so llguidance refuses it by name and path as before (never widened).

The pass runs after objects are closed (schema_closing.close_objects, which leaves `not` and dependency
subschemas as written: closing inside a negation would widen it); each rewritten piece joins its node's `allOf`.
"""

from __future__ import annotations

import copy
import re
from typing import Any, Iterator

TYPES = ("null", "boolean", "object", "array", "string", "number")  # the JSON types ("integer" is in "number")
IGNORED = {"title", "description", "$comment", "default", "examples", "deprecated", "readOnly", "writeOnly",
           "$schema", "$id", "id", "$defs", "definitions"}  # annotations, and containers only a $ref reads
NAME_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas", "dependencies",
             "dependentRequired")  # name -> schema (or list) maps: their keys are names, never keywords
DATA = ("const", "enum", "default", "examples", "required")  # values, not schemas
_DEPENDENCY_KEYS = ("dependencies", "dependentRequired", "dependentSchemas")
_ANY = r"[\s\S]"  # one character, newlines included


class Unsupported(Exception):
    """This negation has no exact positive form here: the keyword stays, and llguidance refuses it."""


def rewrite_logic(schema: Any, original: Any = None) -> Any:
    """`schema` (modified in place) with every `not` and dependency keyword that has an exact positive form
    rewritten into `allOf` members of its node; the others are left as written. A negated `$ref` is read in
    `original` (the schema before objects were closed: negating a narrowed schema would widen it)."""
    if any(re.search(r"/(not|dependencies|dependentSchemas|dependentRequired)(/|$)", r)
           for r in refs_in(schema)):
        return schema  # a $ref into a subschema this pass rewrites: leave the whole schema as written
    _walk(schema, schema if original is None else original)
    return schema


def _walk(node: Any, root: Any) -> None:
    """Rewrite below `node` first (not into `not`, which negate() reads as written), then node's own keywords."""
    if isinstance(node, list):
        for n in node:
            _walk(n, root)
        return
    if not isinstance(node, dict):
        return
    for k, v in node.items():
        if k in NAME_MAPS and isinstance(v, dict):
            for s in v.values():
                _walk(s, root)
        elif k not in DATA and k != "not":
            _walk(v, root)
    pieces = []
    if "not" in node:
        try:
            pieces.append(negate(node["not"], root))
            del node["not"]
        except Unsupported:
            pass
    for key in _DEPENDENCY_KEYS:
        deps = node.get(key)
        if isinstance(deps, dict) and not _holds(list(deps.values()), "not"):
            try:
                pieces.extend([_dependency(name, dep) for name, dep in deps.items()])
                del node[key]
            except Unsupported:
                pass
    pieces = [p for p in pieces if p is not True and p != {}]
    if pieces:
        node["allOf"] = list(node.get("allOf", [])) + pieces


def _dependency(name: str, dep: Any) -> Any:
    """`dependencies: {name: dep}` as a positive schema: `name` absent, or (present and) dep holds."""
    absent = {"properties": {name: False}}
    if isinstance(dep, list) and all(isinstance(d, str) for d in dep):
        return {"anyOf": [absent, {"required": [name, *dep]}]} if dep else True
    if dep is True or dep == {}:
        return True
    if dep is False:
        return absent
    if isinstance(dep, dict):
        return {"anyOf": [absent, dep]}
    raise Unsupported(name)


def negate(schema: Any, root: Any, refs: tuple = ()) -> Any:
    """A positive schema that holds exactly where `schema` fails, or Unsupported."""
    if schema is True or schema == {}:
        return False
    if schema is False:
        return True
    if not isinstance(schema, dict):
        raise Unsupported(schema)
    keys = [k for k in schema if k not in IGNORED]
    if "$ref" in keys:
        ref = schema["$ref"]
        if len(keys) > 1 or not isinstance(ref, str) or not ref.startswith("#") or ref in refs:
            raise Unsupported("$ref")  # siblings of $ref, remote refs and cycles
        target = resolve_pointer(root, ref)
        if target is None:
            raise Unsupported(ref)
        return negate(target, root, refs + (ref,))
    if any(k in schema for k in ("additionalProperties", "additionalItems", "prefixItems", "minContains",
                                 "maxContains")) or isinstance(schema.get("exclusiveMinimum"), bool) \
            or isinstance(schema.get("exclusiveMaximum"), bool):
        raise Unsupported("a keyword that depends on its siblings")
    alternatives: list = []
    for k in keys:
        alternatives.extend(_negate_keyword(k, schema[k], root, refs))
    return any_of(alternatives)


def any_of(alternatives: list) -> Any:
    alternatives = [a for a in alternatives if a is not False]
    if any(a is True or a == {} for a in alternatives):
        return True
    return alternatives[0] if len(alternatives) == 1 else ({"anyOf": alternatives} if alternatives else False)


_OPPOSITE = {"minimum": ("number", "exclusiveMaximum", 0), "maximum": ("number", "exclusiveMinimum", 0),
             "exclusiveMinimum": ("number", "maximum", 0), "exclusiveMaximum": ("number", "minimum", 0),
             "minLength": ("string", "maxLength", -1), "maxLength": ("string", "minLength", 1),
             "minItems": ("array", "maxItems", -1), "maxItems": ("array", "minItems", 1),
             "minProperties": ("object", "maxProperties", -1), "maxProperties": ("object", "minProperties", 1)}


def _negate_keyword(k: str, v: Any, root: Any, refs: tuple) -> list:
    """The alternatives (an anyOf) of `not {k: v}`. A keyword about one type (minimum, required, ...) holds for
    values of the other types, so its negation holds only for values of its type that break it."""
    if k == "type":
        return [_types_but(v if isinstance(v, list) else [v])]
    if k in _OPPOSITE and isinstance(v, (int, float)) and not isinstance(v, bool):
        kind, opposite, step = _OPPOSITE[k]  # values of other types pass k, so they fail `not`
        bound = v + step
        return [{"type": kind, opposite: bound}] if kind == "number" or bound >= 0 else []
    if k == "required" and isinstance(v, list):
        return [{"type": "object", "properties": {name: False}} for name in v]
    if k == "properties" and isinstance(v, dict):
        out = [{"type": "object", "required": [n], "properties": {n: negate(s, root, refs)}} for n, s in v.items()]
        return [o for o in out if o["properties"][o["required"][0]] is not False]
    if k == "not":
        return [_positive(v, root, refs)]
    if k == "oneOf" and isinstance(v, list) and len(v) <= 4:  # none holds, or two do
        positive = [_positive(s, root, refs) for s in v]
        pairs = [all_of([a, b]) for i, a in enumerate(positive) for b in positive[i + 1:]]
        return [all_of([negate(s, root, refs) for s in v]), *pairs]
    if k == "anyOf" and isinstance(v, list):
        return [all_of([negate(s, root, refs) for s in v])]
    if k == "allOf" and isinstance(v, list):
        return [negate(s, root, refs) for s in v]
    if k == "contains":  # an array none of whose items holds
        return [{"type": "array", "items": negate(v, root, refs)}]
    if k == "items" and v is False:
        return [{"type": "array", "minItems": 1}]
    if k == "items" and (v is True or v == {}) or k == "uniqueItems" and v is False:
        return []
    if k == "enum" and isinstance(v, list):
        return _not_in(v)
    if k == "const":
        return _not_in([v])
    raise Unsupported(k)


def _positive(schema: Any, root: Any, refs: tuple) -> Any:
    """`schema` itself, as a positive schema (a copy with its own negations rewritten), or Unsupported."""
    positive = copy.deepcopy(schema)
    _walk(positive, root)
    if _holds(positive, "not") or any(_holds(positive, d) for d in _DEPENDENCY_KEYS) \
            or any(r in refs for r in refs_in(positive)):
        raise Unsupported("not")  # left as written, or a $ref back into what is being negated
    return positive


def all_of(members: list) -> Any:
    if any(m is False for m in members):
        return False
    members = [m for m in members if m is not True and m != {}]
    return members[0] if len(members) == 1 else ({"allOf": members} if members else True)


def _types_but(types: list) -> Any:
    """The values whose type is none of `types`; Unsupported for `integer` without `number` (no positive form)."""
    if "integer" in types and "number" not in types:
        raise Unsupported("integer")
    if any(t not in TYPES + ("integer",) for t in types):
        raise Unsupported(f"type {types}")
    rest = [t for t in TYPES if t not in types]
    return {"type": rest if len(rest) > 1 else rest[0]} if rest else False


def _not_in(values: list) -> list:
    """The alternatives of `not {enum: values}`: per JSON type, the values of that type not listed."""
    kinds = {"null": [], "boolean": [], "number": [], "string": [], "array": [], "object": []}
    for v in values:
        kind = ("null" if v is None else "boolean" if isinstance(v, bool) else "number" if isinstance(v, (int, float))
                else "string" if isinstance(v, str) else "array" if isinstance(v, list) else "object")
        kinds[kind].append(v)
    out: list = [_types_but([t for t, vs in kinds.items() if vs])]
    if kinds["boolean"] and len(set(kinds["boolean"])) == 1:
        out.append({"const": not kinds["boolean"][0]})
    numbers = sorted(set(kinds["number"]))
    if numbers:
        out.append({"type": "number", "exclusiveMaximum": numbers[0]})
        out.extend({"type": "number", "exclusiveMinimum": a, "exclusiveMaximum": b} for a, b in zip(numbers, numbers[1:]))
        out.append({"type": "number", "exclusiveMinimum": numbers[-1]})
    if any('"' in w or "\\" in w for w in kinds["string"]):
        raise Unsupported("enum of strings holding a quote or backslash")  # llguidance 1.9: see _complement
    if kinds["string"]:
        out.append({"type": "string", "pattern": "^" + _complement(sorted(set(kinds["string"]))) + "$"})
    for kind in ("array", "object"):
        if kinds[kind]:
            out.append(all_of([{"type": kind}] + [any_of(_differs(v)) for v in kinds[kind]]))
    return out


def _differs(value: list | dict) -> list:
    """The alternatives of "an array (object) that is not `value`": another length (size), a missing key, or an
    item (property) that differs."""
    if isinstance(value, list):
        out = [{"type": "array", "minItems": len(value) + 1}] + (
            [{"type": "array", "maxItems": len(value) - 1}] if value else [])
        return out + [{"type": "array", "minItems": i + 1, "prefixItems": [{}] * i + [any_of(_not_in([x]))]}
                      for i, x in enumerate(value)]
    out = [{"type": "object", "minProperties": len(value) + 1}]
    out += [{"type": "object", "properties": {k: False}} for k in value]
    return out + [{"type": "object", "required": [k], "properties": {k: any_of(_not_in([x]))}} for k, x in value.items()]


def _complement(words: list[str]) -> str:
    """A regex matching exactly the strings not in `words` (a trie: at each prefix, end elsewhere or branch off).
    Never with `"` or `\\` in `words`: llguidance 1.9 lets a class that spans U+0000-U+001F (as `[^"]` does) match
    the escapes `\\"` and `\\\\` too, so a class cannot exclude them."""
    trie: dict = {}
    for w in words:
        node = trie
        for ch in w:
            node = node.setdefault(ch, {})
        node[""] = {}

    def build(node: dict) -> str:
        chars = sorted(c for c in node if c)
        branch_off = ("[^" + "".join(_escape(c) for c in chars) + "]" if chars else _ANY) + _ANY + "*"
        body = "|".join([branch_off] + [_escape(c) + "(?:" + build(node[c]) + ")" for c in chars])
        return f"(?:{body})" if "" in node else f"(?:{body})?"
    return build(trie)


def _escape(ch: str) -> str:
    """`ch` for a regex, in a syntax both llguidance (Rust regex-syntax) and Python's re read the same way."""
    n = ord(ch)
    return ch if ch.isascii() and ch.isalnum() else (f"\\x{n:02x}" if n < 0x100 else
                                                      f"\\u{n:04x}" if n < 0x10000 else f"\\U{n:08x}")


def resolve_pointer(root: Any, ref: str) -> Any:
    """The node a local `$ref` ("#/a/b") points at, or None."""
    target = root
    for part in (p for p in ref[1:].split("/") if p):
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(target, list) and part.isdigit() and int(part) < len(target):
            target = target[int(part)]
        else:
            target = target.get(part) if isinstance(target, dict) else None
    return target


def dict_nodes(root: Any, skip: tuple[str, ...] = ()) -> Iterator[dict]:
    """Every schema dict inside `root` (depth first), not entering the values of keywords in `skip`; the schemas of a
    NAME_MAPS map are walked whatever their names (a property may be called "default"). Children are read after the
    caller is done with a node, so a node rewritten in place is walked as rewritten."""
    todo = [root]
    while todo:
        node = todo.pop()
        if isinstance(node, list):
            todo.extend(node)
        elif isinstance(node, dict):
            yield node
            for k, v in ((k, v) for k, v in node.items() if k not in skip):
                todo.extend(v.values()) if k in NAME_MAPS and isinstance(v, dict) else todo.append(v)


def _nodes(node: Any, data: bool = False) -> Iterator[dict]:
    """Every object in `node`, inside enum/const/... values too if `data`."""
    return dict_nodes(node, () if data else DATA)


def _holds(node: Any, keyword: str) -> bool:
    """Whether a schema node in `node` holds `keyword`."""
    return any(keyword in n for n in _nodes(node))


def refs_in(node: Any) -> list[str]:
    return [n["$ref"] for n in _nodes(node, data=True) if isinstance(n.get("$ref"), str)]
