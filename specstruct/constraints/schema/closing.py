"""Closing objects to their declared keys before llguidance compiles a schema (so the model cannot invent keys),
without letting the pieces of one object forbid each other's keys (allOf members, anyOf/oneOf branches)."""

from __future__ import annotations

import copy
import re
from typing import Any

from specstruct.constraints.schema.branches import AS_WRITTEN, MAPS
from specstruct.constraints.schema.logic import DATA, dict_nodes, resolve_pointer


_OPEN_KEYS = ("additionalProperties", "patternProperties", "unevaluatedProperties", "allOf")


def close_objects(node: Any, in_all_of: bool = False, one_of: bool = False, root: Any = None) -> Any:
    """Objects whose schema says nothing about undeclared keys get only their declared properties (as OpenAI's
    structured outputs and outlines do): an open object would let the model invent keys. Every generated value
    still validates; valid instances with undeclared keys are rejected (documented in docs/conformance.md).
    `allOf` members and `then`/`else` stay open: each adds properties to the others. Negated, dependency and `if`
    subschemas are left as written (logic/branches rewrite them): closing inside a `not` would widen it.
    So are `oneOf` branches unless `one_of`: exactly-one negates the other branches, and a closed branch would let
    an instance with an undeclared key match one more (llguidance then proves closed branches disjoint that are not).
    With `one_of`, branches puts closed branches only where they are positive (and restores the rest).
    An object with anyOf/oneOf branches is closed to its own keys and its branches' keys, and a branch it closes to
    the branch's keys and the object's own: each key is still checked by whichever declares it."""
    if isinstance(node, list):
        return [close_objects(n, in_all_of, one_of, root) for n in node]
    if not isinstance(node, dict):
        return node
    root = node if root is None else root
    out: dict[str, Any] = {}
    for k, v in node.items():
        if k in MAPS and isinstance(v, dict):  # name -> schema maps: their keys are names, not keywords
            out[k] = {name: close_objects(s, one_of=one_of, root=root) for name, s in v.items()}
        elif k in DATA or k in AS_WRITTEN or k == "oneOf" and not one_of:
            out[k] = copy.deepcopy(v) if k in ("if", "oneOf") else v  # copies: later passes rewrite them in place
        else:
            out[k] = close_objects(v, k in ("allOf", "then", "else"), one_of, root)
    declared = out.get("properties")
    if isinstance(declared, dict):
        _share_keys(node, out, root)
        declared = out["properties"]
    required = out.get("required") if isinstance(out.get("required"), list) else []
    for deps in (out.get("dependencies"), out.get("dependentRequired")):  # required once another key is there
        if isinstance(deps, dict):
            required = required + [n for d in deps.values() if isinstance(d, list) for n in d]
    for branch in (out.get("then"), out.get("else")):  # keys a branch declares or requires keep the object open
        if isinstance(branch, dict):
            required = required + list(branch.get("properties") or []) + list(branch.get("required") or [])
    if (not in_all_of and isinstance(declared, dict) and not any(k in out for k in _OPEN_KEYS)
            and all(name in declared for name in required)):  # a (dependent) required undeclared key keeps it open
        out["additionalProperties"] = False
    return out


_REF = re.compile(r"^#/(definitions|\$defs)/([^/]+)$")


def open_all_of_refs(closed: Any, original: Any, one_of: bool = False) -> Any:
    """`closed` (modified in place) with each `allOf` member that is a `$ref` to a definition pointed at an open twin
    of it. Definitions are closed to their own keys, so `allOf: [{$ref: base}, {properties: {extra: ..}}]` could
    never write `extra` (and admitted no value where `extra` was required); an inline member stays open at its top,
    and the twin is that member written inline, once per definition (`<name>__open`). Negated and dependency
    subschemas are left as written (close_objects does not close them either)."""
    twins: dict[str, Any] = {}
    while True:  # a twin can hold allOf $refs of its own: walk again until no new twin appears
        before = len(twins)
        for node in dict_nodes(closed, skip=DATA + AS_WRITTEN):
            _open_members(node, closed, original, one_of, twins)
        if len(twins) == before:
            return closed


def _open_members(node: dict, closed: Any, original: Any, one_of: bool, twins: dict[str, Any]) -> None:
    """Point `node`'s allOf `$ref` members at open twins (made on first use, kept in `twins`)."""
    for member in node.get("allOf") if isinstance(node.get("allOf"), list) else []:
        m = _REF.match(member.get("$ref", "")) if isinstance(member, dict) and isinstance(
            member.get("$ref"), str) else None
        if m and m.group(2) in twins:  # already a twin (a later pass)
            continue
        defs = closed.get(m.group(1)) if m else None
        target = resolve_pointer(original, member["$ref"]) if m else None
        if not isinstance(defs, dict) or not isinstance(target, dict):
            continue
        name = m.group(2) + "__open"
        if name not in twins:
            if name in defs:  # the schema has a definition of that name already: leave the member as it is
                continue
            twins[name] = defs[name] = close_objects(copy.deepcopy(target), in_all_of=True, one_of=one_of)
        member["$ref"] = f"#/{m.group(1)}/{name}"


def _share_keys(node: dict, out: dict, root: Any) -> None:
    """An object that declares properties and has anyOf/oneOf branches: its own keys join the branches that closing
    closed (as `true`: the object checks them), and the branches' keys join its `properties` (as `true`: the branch
    checks them). Closed separately, each would forbid the other's keys (a parent's `redirectUris` next to a
    tagged union on `grantType` could never be written)."""
    from specstruct.constraints.schema.normalise import follow_ref

    def keys(n: Any, depth: int = 0) -> list[str]:  # keys a branch declares, in its own nested branches too
        n = follow_ref(n, root)
        if depth > 8 or not isinstance(n, dict):
            return []
        found = list(n["properties"]) if isinstance(n.get("properties"), dict) else []
        for k in ("anyOf", "oneOf", "allOf"):
            found += [name for b in (n.get(k) if isinstance(n.get(k), list) else []) for name in keys(b, depth + 1)]
        return found

    own = out["properties"]
    branch_keys: dict[str, Any] = {}
    for key in ("anyOf", "oneOf"):
        for b_in, b_out in zip(node.get(key) or [], out.get(key) or []):
            branch_keys.update(dict.fromkeys(keys(b_in), True))
            if (isinstance(b_in, dict) and isinstance(b_out, dict) and "additionalProperties" not in b_in
                    and b_out.get("additionalProperties") is False and isinstance(b_out.get("properties"), dict)):
                b_out["properties"] = {**b_out["properties"], **{k: True for k in own if k not in b_out["properties"]}}
    if any(k not in own for k in branch_keys):
        out["properties"] = {**own, **{k: True for k in branch_keys if k not in own}}
