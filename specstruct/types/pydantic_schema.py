"""A Pydantic type's JSON schema as specstruct compiles it: keyed the way the type validates (aliases or names), with
what Pydantic leaves out that a grammar can say (a key pattern for dict[int, ...]), and a clear ConstraintError
for what a schema cannot describe (a field read from a path) or Pydantic cannot."""

from __future__ import annotations

import typing
from typing import Any

from specstruct.errors import ConstraintError


def pydantic_schema(t: Any) -> tuple[dict, Any]:
    """(JSON schema, TypeAdapter) of a Pydantic-describable type."""
    from pydantic import TypeAdapter

    by_alias = _check_aliases(t)  # the keys Pydantic validates by (validate_by_alias=False: field names)
    t_schema = _as_extensions_typeddict(t) if isinstance(t, type) and typing.is_typeddict(t) and \
        type(t).__module__ == "typing" else t
    try:
        adapter = TypeAdapter(t_schema)
        schema = adapter.json_schema(by_alias=by_alias, schema_generator=_key_patterns())
    except ConstraintError:
        raise
    except Exception as e:  # PydanticSchemaGenerationError, PydanticUserError, ...
        raise ConstraintError(f"unsupported output type {safe_repr(t)}: Pydantic cannot describe it as JSON "
                              f"({safe_repr(e)}).") from e
    return schema, adapter


def _check_aliases(t: Any) -> bool:
    """A field whose value Pydantic reads from a path (`validation_alias=AliasPath("outer", 0)`) has no JSON-schema
    key: the grammar would write the field's name and every output would fail validation. Nor can one schema key
    a nested model by field names and its parent by aliases (validate_by_alias differing between them)."""
    from pydantic import AliasChoices, AliasPath

    by_alias = set()
    for model in _models(t):
        fields = getattr(model, "model_fields", None) or {}
        if any(f.alias not in (None, name) or f.validation_alias is not None for name, f in fields.items()):
            by_alias.add((getattr(model, "model_config", None) or {}).get("validate_by_alias", True) is not False)
        for name, f in fields.items():
            alias = f.validation_alias
            first = alias.choices[0] if isinstance(alias, AliasChoices) and alias.choices else alias
            if isinstance(first, AliasPath):
                raise ConstraintError(f"field {name!r} of {model.__name__} reads its value from a path ({first!r}), "
                                      "which a JSON schema cannot describe: use a plain alias, or a nested model")
    if len(by_alias) > 1:
        raise ConstraintError(f"the models in {safe_repr(t)} disagree on validate_by_alias (some validate by field "
                              "name only): one JSON schema cannot key them both ways; give them the same setting")
    return by_alias != {False}  # keyed by aliases unless every model validates by name only


def _models(t: Any) -> list[type]:
    """The Pydantic models in a type: itself, its fields' types and their arguments, once each."""
    seen: dict[type, None] = {}
    todo = [t]
    while todo:
        node = todo.pop()
        if isinstance(node, type) and hasattr(node, "model_fields") and node not in seen:
            seen[node] = None
            todo.extend(f.annotation for f in node.model_fields.values())
        else:
            todo.extend(typing.get_args(node))
    return list(seen)


def _key_patterns() -> type:
    """Pydantic's JSON-schema generator, with a `propertyNames` a grammar can enforce for dict keys Pydantic parses
    from strings: for int, float and bool keys Pydantic writes none (any key was allowed, and validation failed on
    "one"), and for int enums, UUIDs and dates it writes one that names a type or format a key string never has."""
    from pydantic.json_schema import GenerateJsonSchema

    class KeyPatterns(GenerateJsonSchema):
        def dict_schema(self, schema: Any) -> Any:
            out = super().dict_schema(schema)
            names = _key_names(schema.get("keys_schema") or {})
            if names is not None:
                out["propertyNames"] = names
            return out

        def datetime_schema(self, schema: Any) -> Any:
            return _moment(super().datetime_schema(schema), f"{DATE}T{TIME}", schema.get("tz_constraint"))

        def time_schema(self, schema: Any) -> Any:
            return _moment(super().time_schema(schema), TIME, schema.get("tz_constraint"))

        def decimal_schema(self, schema: Any) -> Any:
            return _decimal_strings(super().decimal_schema(schema))

    return KeyPatterns


# RFC 3339 (llguidance's `date-time` and `time` formats) requires an offset, so every datetime came back
# timezone-aware and NaiveDatetime never validated. As Pydantic reads them: an offset for AwareDatetime, none for
# NaiveDatetime, either for datetime / time. Days follow the month (29 February in any year: the validator's).
DATE = (r"(?:000[1-9]|00[1-9][0-9]|0[1-9][0-9]{2}|[1-9][0-9]{3})-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])|(?:0[469]|11)-(?:0[1-9]|[12][0-9]|30)"
        r"|02-(?:0[1-9]|1[0-9]|2[0-9]))")
TIME = r"(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\.[0-9]{1,6})?"
OFFSET = r"(?:Z|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])"


def _moment(out: dict, body: str, tz: str | None) -> dict:
    offset = {"aware": OFFSET, "naive": ""}.get(tz or "", f"{OFFSET}?")
    out.pop("format", None)
    return {**out, "pattern": f"^{body}{offset}$"}


def _decimal_strings(out: Any) -> Any:
    """A Decimal's string form with the pattern of what Pydantic parses as a decimal, whatever this Pydantic
    version writes: some versions write a look-ahead pattern, others a bare `{"type": "string"}` (the grammar then
    wrote "." and validation failed)."""
    from specstruct.constraints.llguidance.schema_text import DECIMAL_EQUIVALENT, DECIMAL_PATTERN

    if isinstance(out, dict):
        if out.get("type") == "string" and out.get("pattern") in (None, DECIMAL_PATTERN):
            return {**out, "pattern": DECIMAL_EQUIVALENT}
        return {k: [_decimal_strings(v) for v in vs] if k in ("anyOf", "oneOf") and isinstance(vs, list) else vs
                for k, vs in out.items()}
    return out


def _key_names(keys: dict) -> dict | None:
    """The key names of a dict whose keys Pydantic parses from strings, or None (left as Pydantic writes it): keys
    with their own bounds or versions (`dict[PositiveInt, X]`, `dict[UUID4, X]`) are left to the validator."""
    kind = keys.get("type")
    if kind == "literal":  # Pydantic never reads a JSON key as a non-string literal (1 from "1"): those never validate
        names = [v for v in keys["expected"] if isinstance(v, str)]
        if not names:
            raise ConstraintError(f"dict keys of type Literal{keys['expected']!r}: Pydantic reads JSON keys as strings "
                                  "and never as these values, so no non-empty dict validates; use string literals "
                                  "or an IntEnum")
        return {"enum": names}
    if kind == "enum" and keys.get("sub_type") in ("int", "float"):
        return {"enum": [str(m.value) for m in keys.get("members", [])]}
    if set(keys) - {"type", "metadata", "ref", "serialization", "strict"}:
        return None
    if kind == "bool":
        return {"enum": ["true", "false"]}
    return {"pattern": KEY_PATTERNS[kind]} if kind in KEY_PATTERNS else None


INT_KEY = r"^-?(0|[1-9][0-9]*)$"  # keys as JSON writes numbers: subsets of what Pydantic parses
KEY_PATTERNS = {"int": INT_KEY, "float": r"^-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?$",
                "decimal": r"^-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?$",
                "uuid": r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$",
                "date": r"^[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])$"}


def _as_extensions_typeddict(t: type) -> type:
    """Pydantic needs typing_extensions.TypedDict before Python 3.12: rebuild `t` as one (same keys)."""
    import typing_extensions as te

    hints = typing.get_type_hints(t)
    fields = {k: (v if k in t.__required_keys__ else te.NotRequired[v]) for k, v in hints.items()}
    return te.TypedDict(t.__name__, fields)  # type: ignore[operator]


def safe_repr(value: Any) -> str:
    try:
        return repr(value)[:300]
    except RecursionError:  # a type nested hundreds deep
        return f"<{type(value).__name__} nested too deeply to print>"
