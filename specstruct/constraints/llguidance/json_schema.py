"""JSON schemas through llguidance's own JSON-schema compiler (the default JSON backend).

llguidance turns a schema into a context-free grammar whose lexer is built lazily, so compile takes
milliseconds whatever the bounds (`maxItems: 1e9`, `minLength: 100000`, recursive `$ref`s are grammar
rules, not unrolled), and every step is bounded by its fuel limits (limits.llguidance_limits()). It
enforces numeric bounds, `allOf`, `patternProperties`, `additionalProperties` and formats itself, refuses
`oneOf` unless its branches are provably disjoint, and errors on any keyword it does not implement: so a
schema is either guaranteed or refused, never silently widened. `not` and `dependencies` (which llguidance lacks)
are first rewritten into exact positive equivalents where they have one (schema/logic.py), and so are `if`/`then`/`else`
and, when llguidance cannot prove a `oneOf`'s branches disjoint, that `oneOf` (branches.py); the rest stay refused.
Only a `format` it does not know is dropped
(JSON Schema makes an unknown format an annotation, which validators do not check either). JSON is written in `json.dumps` form
(", " and ": ", no other whitespace), as the engine and its speculative drafter expect.

Compiled matchers are cached per (tokenizer, schema) as templates in the byte-bounded LRU (cache.py);
each compile returns a deep copy.
"""

from __future__ import annotations

import copy
import json
import re
from typing import Any, Sequence

from specstruct.constraints.cache import ByteLRU
from specstruct.constraints.llguidance.bounded import compile_here, panic, run_bounded
from specstruct.constraints.llguidance.grammar import GrammarConstraint, _lltokenizer
from specstruct.constraints.limits import check_schema, limits, llguidance_limit, llguidance_limits, too_complex
from specstruct.constraints.schema.branches import MAX_ONE_OF, deref, rewrite_branches
from specstruct.constraints.schema.closing import close_objects, open_all_of_refs
from specstruct.constraints.schema.logic import dict_nodes, resolve_pointer, rewrite_logic
from specstruct.constraints.schema.names import rewrite_property_names
from specstruct.errors import ConstraintError

OPTIONS = {"item_separator": ", ", "key_separator": ": ", "whitespace_flexible": False, "coerce_one_of": False,
           "lenient": False}
TEMPLATES = ByteLRU(lambda: limits().cache_mb << 20)


def parse_schema(source: str | dict | bool) -> Any:
    """The schema as a Python value; a ConstraintError for bad JSON, oversize text or too deep nesting."""
    if isinstance(source, str):
        if len(source) > limits().max_schema_bytes:
            raise too_complex("the JSON schema", "max_schema_bytes", f"{len(source)} bytes of schema text")
        try:
            source = json.loads(source)
        except ValueError as e:  # also an integer past Python's 4300 digits, not only a JSONDecodeError
            raise ConstraintError(f"the JSON schema is not valid JSON: {' '.join(str(e).split())[:300]}") from None
        except RecursionError as e:
            raise too_complex("the JSON schema", "max_schema_depth", "it nests too deeply to parse") from e
    check_schema(source)
    if source is True:
        source = {}
    if not isinstance(source, dict):
        raise ConstraintError(f"a JSON schema must be an object, got {type(source).__name__}; pass a dict.")
    return source


def prepare(source: str | dict | bool, one_of: bool = False) -> Any:
    """The schema as llguidance gets it: tagged-union oneOfs as anyOf, objects closed (allOf members that are `$ref`s
    open, as inline members are), then `if`/`then`/`else` (and if `one_of`, every other oneOf), `not` and dependency
    keywords rewritten into exact positive equivalents where they have one (schema.branches, schema.logic)."""
    schema = rewrite_property_names(discriminated_oneofs(parse_schema(source)))
    closed = open_all_of_refs(close_objects(schema, one_of=one_of), schema, one_of)
    return rewrite_logic(rewrite_branches(closed, schema, one_of), original=schema)


def _grammar(source: str | dict | bool, lltok=None) -> tuple[Any, str, str]:
    """(prepared schema, llguidance grammar, llguidance's error or ""). A `oneOf` llguidance cannot prove disjoint
    is rewritten (each branch with the others negated) in a second round; formats it does not know are dropped."""
    from llguidance import LLMatcher

    for one_of in (False, True):
        schema = prepare(source, one_of)
        for _ in range(32):  # drop the formats llguidance does not know, one per round
            try:
                grammar = LLMatcher.grammar_from_json_schema(schema, defaults=OPTIONS)
            except (ValueError, RuntimeError) as e:
                raise _error(str(e), schema) from e
            error = (LLMatcher.validate_grammar(grammar, lltok, limits=llguidance_limits()) if lltok is not None
                     else LLMatcher.validate_grammar(grammar))
            unknown = re.search(r"Unknown format: (.*?)(?: at |$)", error.strip()) if error else None
            if unknown is None or not _drop_format(schema, unknown.group(1).strip()):
                break
        if not error or "oneOf constraints are not supported" not in error:
            break
    return schema, grammar, error


def check_support(source: str) -> None:
    """Refuse a schema llguidance cannot guarantee (ConstraintError naming keyword and path) without a tokenizer,
    in a child under the compile limits (bounded.py): cheap enough to run before a model loads (the CLI does)."""
    run_bounded(lambda: guaranteed_schema(source), "the JSON schema")


def guaranteed_schema(source: str) -> Any:
    """The schema as it is compiled (prepared for llguidance, as `compile_json` would), for embedding in a grammar
    with `%json` (tool arguments); ConstraintError naming keyword and path when it cannot be guaranteed. In this
    process, without a clock: callers run it under `bounded.run_bounded`."""
    schema, _, error = _grammar(source)
    if error and "Unknown format" not in error:
        raise _error(error, schema)
    return schema


def compile_json(source: str, tokenizer, table, vocab_size: int, eos_ids: Sequence[int], mode: str):
    """A GrammarConstraint at the start of `source`'s instances, or ConstraintError naming keyword and path.
    A schema not compiled before is first compiled in a child process under the compile limits (bounded.py), then
    here: twice a few milliseconds for a usual schema, and none of a hostile one's minutes in this process."""
    key = (table.key, vocab_size, source, limits().lexer_fuel, limits().memory_mb)  # a template keeps its limits
    cached = TEMPLATES.get(key)
    if cached is None:
        lltok = _lltokenizer(tokenizer, table, vocab_size)
        # a trial in a child, under the compile limits (llguidance's compile and the rewrites have no clock of
        # their own), running only llguidance and the rewrites; then the compile here, and the language checked
        template, schema, grammar = compile_here(lambda: _template(source, lltok), "the JSON schema")
        probe = GrammarConstraint(template.deep_copy(), tokenizer, vocab_size, eos_ids, mode)
        if not probe.mask().any():
            raise ConstraintError("this JSON schema admits no value (its language is empty); check enum/const "
                                  "lists, required properties and min/max bounds.")
        cached = (template, property_names(schema))
        TEMPLATES.put(key, cached, 64 * 1024 + 64 * len(grammar))
    template, keys = cached
    return GrammarConstraint(template.deep_copy(), tokenizer, vocab_size, eos_ids, mode, keys=keys)


def _template(source: str, lltok) -> tuple[Any, Any, str]:
    """(the schema's LLMatcher at its start, having computed its first mask; the prepared schema; its llguidance
    grammar), or ConstraintError naming keyword and path."""
    from llguidance import LLMatcher

    schema, grammar, error = _grammar(source, lltok)
    if error:
        raise _error(error, schema)
    template = LLMatcher(lltok, grammar, log_level=0, limits=llguidance_limits())
    if template.is_error():
        raise _error(template.get_error(), schema)
    template.deep_copy().compute_bitmask()  # the lazy lexer's first states: part of the compile's cost
    return template, schema, grammar


_DATA = ("const", "default", "enum", "examples")  # keywords whose values are instances, not schemas


def property_names(schema: Any) -> tuple[str, ...]:
    """Every property name `schema` declares, each once: an object's properties together in their declared order,
    objects depth first."""
    names: dict[str, None] = {}
    todo = [schema]
    while todo:
        node = todo.pop()
        if isinstance(node, list):
            todo.extend(reversed(node))
        elif isinstance(node, dict):
            todo.extend(reversed([v for k, v in node.items() if k not in _DATA and k != "properties"]))
            props = node.get("properties")
            if isinstance(props, dict):  # (walked first: pushed last)
                names.update((k, None) for k in props if isinstance(k, str))
                todo.extend(reversed(list(props.values())))  # the properties' schemas, whatever their names
    return tuple(names)


def _error(message: str, schema: Any) -> ConstraintError:
    """llguidance's message, with the keyword and the JSON path it concerns where they can be found."""
    if known := panic("the JSON schema", message):
        return known
    message = " ".join(message.strip().split())[:500]
    lower = message.lower()
    if hit := llguidance_limit(message):
        return too_complex("the JSON schema", hit[1], f"{hit[0]}: {message}")
    if ("generate regex for" in lower and "range" in lower) or "not json serializable" in lower or "(0(0(0" in message:
        return ConstraintError(f"a numeric bound (minimum/maximum/exclusiveMinimum/exclusiveMaximum) is beyond what "
                               f"the grammar can express ({message[:160]}): llguidance writes a range as a regex, "
                               "which it cannot for an int64's range, |x| from about 1e18 up or a tiny non-zero "
                               "bound; drop that bound and check it after generation")
    m = re.search(r'Unimplemented keys: \[([^\]]*)\]', message)
    keys = re.findall(r'"([^"]+)"', m.group(1)) if m else []
    keyword = ("if" if "if" in keys else keys[0]) if keys else next((k for k in ("oneOf", "$ref", "pattern", "format", "allOf", "anyOf")
                                         if k.lower() in lower or k in message), None)
    if "not present in a registry" in message or "retriev" in lower:
        keyword, why = "$ref", "remote or unresolvable $ref (only local references '#/...' are followed)"
    elif "unsatisfiable" in lower:
        return ConstraintError(f"this JSON schema admits no value (at all, or once objects get only their declared "
                               f"properties): {message}. Check enum/const lists, bounds and required properties.")
    elif "oneof" in lower:
        why = "its branches may overlap, so exactly-one cannot be guaranteed; use anyOf if overlap is fine"
        node = resolve_pointer(schema, _find(schema, "oneOf") or "#")
        if isinstance(node, dict) and isinstance(node.get("oneOf"), list) and len(node["oneOf"]) > MAX_ONE_OF:
            why += (f" (overlapping oneOf branches are rewritten, each with the others negated, only up to "
                    f"MAX_ONE_OF={MAX_ONE_OF} branches where a negation is needed; this one has {len(node['oneOf'])})")
    else:
        why = message
    path = _find(schema, keyword) if keyword else None
    where = f"'{keyword}' at {path}" if path else (f"'{keyword}'" if keyword else "")
    return ConstraintError(f"unsupported JSON-schema keyword {where}: {why}. specstruct never falls back to "
                           "unconstrained output; remove or rewrite it (validate it after generation instead)."
                           if keyword else f"this JSON schema cannot be compiled: {message}")


def _drop_format(schema: Any, name: str) -> bool:
    """Remove `format: name` everywhere (JSON Schema makes an unknown format an annotation); True if any was."""
    found, todo = False, [schema]
    while todo:
        node = todo.pop()
        if isinstance(node, dict):
            if node.get("format") == name:
                del node["format"]
                found = True
            todo.extend(node.values())
        elif isinstance(node, list):
            todo.extend(node)
    return found


def discriminated_oneofs(schema: Any) -> Any:
    """A copy of `schema` where each `oneOf` whose branches are told apart by a discriminator (a property every
    branch requires, with pairwise disjoint const/enum values, as Pydantic's tagged unions write them) is an
    `anyOf`: at most one object can match, so the two are equivalent on objects. A non-object satisfies every branch
    that does not fix its type (`required` and `properties` hold for it), so exactly-one fails it: the node becomes
    `type: object` (a oneOf under another type is left as written). llguidance cannot see that through $refs."""
    schema = copy.deepcopy(schema)
    for node in dict_nodes(schema):
        branches = node.get("oneOf")
        if isinstance(branches, list) and len(branches) > 1 and "anyOf" not in node:
            kind = node.get("type", "object")
            if (kind == "object" or isinstance(kind, list) and "object" in kind) and _discriminator(
                    schema, [deref(schema, b) for b in branches]):
                node["anyOf"], node["type"] = node.pop("oneOf"), "object"
    return schema


def _discriminator(root: Any, branches: list) -> str | None:
    if not all(isinstance(b, dict) and isinstance(b.get("properties"), dict) for b in branches):
        return None
    common = set.intersection(*(set(b.get("required", [])) & set(b["properties"]) for b in branches))
    for name in sorted(common):
        seen: list = []
        for b in branches:
            prop = deref(root, b["properties"][name])
            values = [prop["const"]] if isinstance(prop, dict) and "const" in prop else (
                prop.get("enum") if isinstance(prop, dict) else None)
            if not isinstance(values, list) or any(v in seen for v in values):
                break
            seen.extend(values)
        else:
            return name
    return None


def _find(node: Any, keyword: str, path: str = "#") -> str | None:
    """The JSON path of the first schema node holding `keyword` (breadth-first)."""
    todo = [(node, path)]
    while todo:
        node, where = todo.pop(0)
        if isinstance(node, dict):
            if keyword in node:
                return where
            todo.extend((v, f"{where}/{k}") for k, v in node.items() if k not in ("enum", "const", "default",
                                                                                   "examples"))
        elif isinstance(node, list):
            todo.extend((v, f"{where}/{i}") for i, v in enumerate(node))
    return None
