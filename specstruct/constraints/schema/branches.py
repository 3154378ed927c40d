"""Rewrite `if`/`then`/`else`, and `oneOf` whose branches may overlap, into exact positive schemas.

llguidance has no `if`/`then`/`else`, and compiles `oneOf` only when it can prove the branches disjoint. Both have an
exact form built from logic's negation:

- `if: I, then: T, else: E` holds exactly for `anyOf: [allOf: [I, T], allOf: [not I, E]]` (a missing `then`/`else` is
  `true`; without `then`, `anyOf: [I, E]` needs no negation; an `if` alone constrains nothing and is dropped);
- `oneOf: [A, B, C]` (exactly one holds) is `anyOf: [allOf: [A, not B, not C], allOf: [B, not A, not C], ...]`. A
  `not B` is left out of A's member where no value satisfies both A (as generated: closed) and B, which a cheap check
  sees (`_excludes`: disjoint types, a key B requires that closed A does not declare, a key A requires whose
  const/enum values B's differ from); where some `not` is needed, at most MAX_ONE_OF branches are rewritten (the
  grammar grows with the square of the count).

A form is rewritten only when every negation it needs has an exact positive form (logic.negate); otherwise it
is left as written, and llguidance refuses it by keyword and path as before: never widened.

The pass runs on the schema after objects are closed (schema_closing.close_objects), walking the closed and the
original schema side by side: a negated branch or `if` is the ORIGINAL one (closing inside a negation would widen
it); a positive oneOf branch is closed (a sound narrowing), and a oneOf left as written gets its original branches
back (llguidance negates them too); `then`/`else` are closed below their top, like `allOf` members. Each rewritten
form joins its node's `allOf`, so the node's other keywords stay as they are.
"""

from __future__ import annotations

import copy
import re
from typing import Any

from specstruct.constraints.schema.logic import DATA, Unsupported, all_of, any_of, negate, refs_in, resolve_pointer

MAX_ONE_OF = 4  # oneOf branches rewritten at most where a branch must carry the negations of others
# name -> schema maps that closing enters (logic.NAME_MAPS also lists the dependency maps, which closing
# leaves AS_WRITTEN: closing inside them would widen what they negate)
MAPS = ("properties", "patternProperties", "$defs", "definitions")
AS_WRITTEN = ("not", "dependencies", "dependentSchemas", "dependentRequired", "if")  # never closed: they are negated


def rewrite_branches(schema: Any, original: Any, one_of: bool = True) -> Any:
    """`schema` (the closed form of `original`, modified in place) with each `if`/`then`/`else`, and if `one_of`
    each `oneOf`, that has an exact positive form rewritten as one; the others are left as written."""
    if any(re.search(r"/(oneOf|if|then|else)(/|$)", r) for r in refs_in(original)):
        return schema  # a $ref into a subschema this pass moves: leave the whole schema as written
    _walk(schema, original, (schema, original), one_of)
    return schema


def _walk(node: Any, orig: Any, roots: tuple, one_of: bool) -> None:
    """Rewrite below `node` first (not into negated or dependency subschemas: logic reads them as written),
    then node's own `oneOf` and `if`. `orig` is the same place in the original schema; `roots` (closed, original)."""
    if isinstance(node, list) and isinstance(orig, list):
        for n, o in zip(node, orig):
            _walk(n, o, roots, one_of)
        return
    if not isinstance(node, dict) or not isinstance(orig, dict):
        return
    for k, v in node.items():
        if k not in orig:  # additionalProperties added by closing
            continue
        if k in MAPS and isinstance(v, dict) and isinstance(orig[k], dict):
            for name, s in v.items():
                _walk(s, orig[k].get(name), roots, one_of)
        elif k not in DATA and k not in AS_WRITTEN:
            _walk(v, orig[k], roots, one_of)
    pieces = []
    branches = node.get("oneOf")
    if one_of and isinstance(branches, list) and len(branches) > 1:
        try:
            pieces.append(_exactly_one(branches, orig["oneOf"], roots))
            del node["oneOf"]
        except Unsupported:
            node["oneOf"] = copy.deepcopy(orig["oneOf"])  # left as written: its original (unclosed) branches back
            _walk(node["oneOf"], orig["oneOf"], roots, one_of)
    if "if" in node:
        try:
            pieces.append(_conditional(node, orig, roots, one_of))
            for k in ("if", "then", "else"):
                node.pop(k, None)
        except Unsupported:
            pass
    pieces = [p for p in pieces if p is not True and p != {}]
    if pieces:
        node["allOf"] = list(node.get("allOf", [])) + pieces


def _exactly_one(branches: list, originals: list, roots: tuple) -> Any:
    """Each branch (as closed) with the negations of the others (as written) it does not already exclude."""
    others = [[j for j in range(len(branches)) if j != i and not _excludes(branches[i], originals[j], roots)]
              for i in range(len(branches))]
    if any(others) and len(branches) > MAX_ONE_OF:
        raise Unsupported("oneOf")  # the grammar would grow with the square of the count
    negations = {j: negate(originals[j], roots[1]) for js in others for j in js}
    return any_of([all_of([branch] + [copy.deepcopy(negations[j]) for j in others[i]])
                   for i, branch in enumerate(branches)])


def _conditional(node: dict, orig: dict, roots: tuple, one_of: bool) -> Any:
    """`if`/`then`/`else` of `node` as one positive schema; `if` is read as written (it is negated)."""
    if "then" not in node and "else" not in node:
        return True  # an `if` alone constrains nothing
    condition = copy.deepcopy(orig["if"])
    _walk(condition, orig["if"], roots, one_of)  # the positive copy gets its own oneOf/if rewritten
    then, otherwise = node.get("then", True), node.get("else", True)
    if "then" not in node:
        return any_of([condition, otherwise])  # I or (not I and E) == I or E
    return any_of([all_of([condition, then]), all_of([negate(orig["if"], roots[1]), otherwise])])


def _excludes(a: Any, b: Any, roots: tuple) -> bool:
    """Whether no value satisfies both `a` (a branch as closed) and `b` (as written), by a cheap sufficient check."""
    a, b = deref(roots[0], a), deref(roots[1], b)
    if a is False or b is False:
        return True
    if not isinstance(a, dict) or not isinstance(b, dict):
        return False
    ta, tb = _types(a), _types(b)
    if ta is not None and tb is not None and not ta & tb:
        return True
    declared = a.get("properties") if isinstance(a.get("properties"), dict) else None
    if (declared is not None and a.get("additionalProperties") is False and "patternProperties" not in a
            and {"object"} in (ta, tb) and any(k not in declared for k in _names(b.get("required")))):
        return True  # b requires a key a never has
    b_declared = b.get("properties") if isinstance(b.get("properties"), dict) else {}
    for k in _names(a.get("required")) if ta == {"object"} and declared is not None else []:
        va, vb = _values(roots[0], declared.get(k)), _values(roots[1], b_declared.get(k))
        if va is not None and vb is not None and not any(x == y for x in va for y in vb):
            return True  # a's required k takes values b's k never does
    return False


def deref(root: Any, node: Any) -> Any:
    """`node`, or the node its local `$ref` chain (up to 8 long) leads to in `root`; None past that."""
    for _ in range(8):
        ref = node.get("$ref") if isinstance(node, dict) else None
        if not (isinstance(ref, str) and ref.startswith("#")):
            return node
        node = resolve_pointer(root, ref)
    return None


def _types(node: dict) -> set | None:
    """The JSON types `node` allows (integer counted as number), or None for any."""
    t = node.get("type")
    types = [t] if isinstance(t, str) else t if isinstance(t, list) else None
    return None if types is None else {"number" if x == "integer" else x for x in types}


def _names(required: Any) -> list:
    return [k for k in required if isinstance(k, str)] if isinstance(required, list) else []


def _values(root: Any, node: Any) -> list | None:
    """The values a const/enum property schema allows, or None."""
    node = deref(root, node)
    if isinstance(node, dict) and "const" in node:
        return [node["const"]]
    return node["enum"] if isinstance(node, dict) and isinstance(node.get("enum"), list) else None
