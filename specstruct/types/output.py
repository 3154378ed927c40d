"""User output types -> what to compile (ConstraintSpec), what to tell the model, how to parse the text back.

| output type                                   | mode    | value                        |
|-----------------------------------------------|---------|------------------------------|
| None, str                                     | text    | str                          |
| BaseModel, list[Model], TypedDict, dataclass, | json    | validated instance (Pydantic |
| int, float, bool, other typing generics       |         | TypeAdapter)                 |
| dict (a JSON schema)                          | json    | parsed JSON, checked by      |
|                                               |         | `jsonschema`                 |
| Literal["a", "b"], Enum of strings, Choice    | choice  | the str / the Enum member    |
| Regex(pattern)                                | regex   | str                          |
| Grammar(lark_text)                            | grammar | str                          |
| Code("python")                                | code    | str (checked by ast.parse)   |

Pydantic types compile with their *structure* guaranteed; value bounds JSON-schema regexes cannot
express (`ge=0`, `multiple_of`, unique items) are left to Pydantic validation after generation, and the
API retries with the validation error. A raw JSON-schema dict has no such validator, so there an
inexpressible keyword raises ConstraintError at compile time.
"""

from __future__ import annotations

import ast
import enum
import json
import re
import typing
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any, Callable, Literal, get_args, get_origin

from specstruct.errors import ConstraintError
from specstruct.constraints.base import ConstraintSpec, Mode
from specstruct.constraints.compiler import default_json_backend
from specstruct.constraints.schema.normalise import relaxed
from specstruct.constraints.llguidance.schema_text import llguidance_source, required_tags
from specstruct.types.pydantic_schema import pydantic_schema
from specstruct.types.python_regex import rust_pattern


@dataclass(frozen=True)
class Regex:
    """Text matching `pattern` entirely (Rust regex syntax)."""

    pattern: str

    def __post_init__(self):
        if isinstance(self.pattern, re.Pattern):  # re.compile(...) given: its pattern text, its flags inline
            object.__setattr__(self, "pattern", rust_pattern(self.pattern))
        if not isinstance(self.pattern, str):
            raise ConstraintError(f"ss.Regex takes the pattern as a str, got {type(self.pattern).__name__} "
                                  f"({self.pattern!r:.60}).")


@dataclass(frozen=True)
class Choice:
    """Exactly one of `options`, as raw text."""

    options: tuple[str, ...]

    def __init__(self, options: typing.Iterable[str]):
        if isinstance(options, (str, bytes)):
            raise ConstraintError(f"ss.Choice takes a list of options, got the single string {options!r:.60}: "
                                  f"write ss.Choice([{options!r:.60}]) for one option.")
        options = tuple(options)
        wrong = [o for o in options if not isinstance(o, str) and not isinstance(o, enum.Enum)]
        if wrong:
            raise ConstraintError(f"ss.Choice options are strings; got {wrong[0]!r:.60} "
                                  f"({type(wrong[0]).__name__}): convert it with str() if you mean its text.")
        object.__setattr__(self, "options", tuple(str(o.value if isinstance(o, enum.Enum) else o) for o in options))
        for o in self.options:
            try:
                o.encode("utf-8")
            except UnicodeEncodeError as e:
                raise ConstraintError(f"ss.Choice option {o[:60]!r} holds a lone surrogate ({o[e.start]!r} at "
                                      f"character {e.start}), which has no UTF-8 encoding: remove it or write the "
                                      "whole character") from None


@dataclass(frozen=True)
class Grammar:
    """Text in the language of a Lark grammar (llguidance dialect; the start rule is `start`).

    `instruction` is the sentence added to the system prompt (None: one that quotes the grammar; "": nothing,
    e.g. when the chat template already describes the format, as with tool calls)."""

    lark: str
    instruction: str | None = None

    def __post_init__(self):
        if not isinstance(self.lark, str):
            raise ConstraintError(f"ss.Grammar takes the Lark grammar as a str, got {type(self.lark).__name__} "
                                  f"({self.lark!r:.60}).")


@dataclass(frozen=True)
class Code:
    """Source code in `language`, generated freely and checked after generation (ast.parse for python)."""

    language: str = "python"


@dataclass(frozen=True)
class OutputSpec:
    spec: ConstraintSpec
    json_schema: dict | None
    instruction: str
    parser: Callable[[str], Any] = field(repr=False)
    output_type: Any = None
    from_tokens: Callable[[str, Any], Any] | None = field(default=None, repr=False)  # a value that needs the ids

    @property
    def mode(self) -> Mode:
        return self.spec.mode

    def parse(self, text: str, token_ids: Any = ()) -> Any:
        """The value of `text`; raises pydantic.ValidationError, ValueError or SyntaxError when it fails."""
        return self.from_tokens(text, token_ids) if self.from_tokens else self.parser(text)


def resolve(output_type: Any) -> OutputSpec:
    """Turn any supported output type into an OutputSpec; ConstraintError for anything else."""
    if output_type is None or output_type is str:
        return OutputSpec(ConstraintSpec("text", None), None, "", lambda t: t, output_type)
    if isinstance(output_type, Regex):
        return OutputSpec(ConstraintSpec("regex", output_type.pattern), None,
                          f"Answer with text that matches the regular expression {output_type.pattern}",
                          lambda t: t, output_type)
    if isinstance(output_type, Choice):
        return _choice(list(output_type.options), output_type, lambda t: t)
    if isinstance(output_type, Grammar):
        instruction = output_type.instruction
        if instruction is None:
            instruction = "Answer with text in the language of this Lark grammar:\n" + output_type.lark
        return OutputSpec(ConstraintSpec("grammar", output_type.lark), None, instruction,
                          lambda t: t, output_type)
    if isinstance(output_type, Code):
        return OutputSpec(ConstraintSpec("code", None), None,
                          f"Answer with {output_type.language} code only, no explanation.",
                          lambda t: parse_code(t, output_type.language), output_type)
    if isinstance(output_type, dict):
        return _schema_dict(output_type)
    if get_origin(output_type) is Literal and all(isinstance(a, enum.Enum) and isinstance(a.value, str)
                                                  for a in get_args(output_type)):  # Literal[Color.RED, ...]
        members = {str(a.value): a for a in get_args(output_type)}
        return _choice(list(members), output_type, members.__getitem__)
    if get_origin(output_type) is Literal and all(isinstance(a, str) for a in get_args(output_type)):
        return _choice(list(get_args(output_type)), output_type, lambda t: t)
    if isinstance(output_type, type) and issubclass(output_type, enum.Enum):
        values = [m.value for m in output_type]
        if values and all(isinstance(v, str) for v in values):
            return _choice(values, output_type, output_type)
    if _typed(output_type):
        return _pydantic(output_type)
    raise ConstraintError(
        f"unsupported output type {output_type!r}: use None/str, a Pydantic model, list[Model], TypedDict, "
        "dataclass, int, float, bool, Literal, Enum, a JSON-schema dict, ss.Regex, ss.Choice, ss.Grammar or ss.Code."
    )


def _choice(options: list[str], output_type: Any, convert: Callable[[str], Any]) -> OutputSpec:
    if not options:
        raise ConstraintError("a choice needs at least one option; pass a non-empty list of strings.")

    def parse(text: str) -> Any:
        if text not in options:
            raise ValueError(f"{text!r} is not one of the options {options}")
        return convert(text)

    return OutputSpec(ConstraintSpec("choice", json.dumps(options)), None,
                      "Answer with exactly one of: " + ", ".join(options) + ".", parse, output_type)


def _typed(t: Any) -> bool:
    if t in (int, float, bool):
        return True
    if isinstance(t, type):  # models, dataclasses, TypedDicts, enums, datetime, UUID, Decimal, ...
        return t is not object
    return get_origin(t) is not None  # list[Model], dict[str, int], Optional[X], Literal[1, 2], ...


def _pydantic(t: Any) -> OutputSpec:
    schema, adapter = pydantic_schema(t)
    source = relaxed(schema) if default_json_backend() == "outlines" else required_tags(llguidance_source(schema))
    return OutputSpec(ConstraintSpec("json", json.dumps(source)), schema, _json_instruction(schema),
                      adapter.validate_json, t)


# jsonschema's metaschema check has no time bound; above this size it is skipped (the compile, which is bounded,
# still refuses what it cannot read), so a schema just under max_schema_bytes cannot hold a call for a minute.
METASCHEMA_CHECK_BYTES = 256 << 10


def _check_schema(validator_cls: Any, schema: dict) -> None:
    """validator_cls.check_schema, except that a `pattern` is not checked with Python's `re` (the metaschema's
    "regex" format): `\\p{Lu}` and other ECMA/Rust syntax Python lacks are valid, and the regex compiler that
    enforces the pattern reports its own syntax errors."""
    import jsonschema

    checker = jsonschema.FormatChecker([f for f in validator_cls.FORMAT_CHECKER.checkers if f != "regex"])
    error = jsonschema.exceptions.best_match(
        validator_cls(validator_cls.META_SCHEMA, format_checker=checker).iter_errors(schema))
    if error is not None:
        raise jsonschema.SchemaError.create_from(error)


def _schema_dict(schema: dict) -> OutputSpec:
    import jsonschema

    from specstruct.constraints.limits import check_schema, limits, too_complex
    from specstruct.constraints.schema.pattern_check import linear_validator

    check_schema(schema)  # depth first (iteratively): jsonschema's own check recurses
    try:
        text = json.dumps(schema, allow_nan=False)
    except (TypeError, ValueError) as e:  # object(), a set, NaN or Infinity somewhere in the dict
        what = "NaN or Infinity" if isinstance(e, ValueError) else str(e)
        raise ConstraintError(f"the JSON schema holds a value JSON cannot write ({what}); use plain JSON values") from e
    size = len(text.encode())
    if size > limits().max_schema_bytes:  # before jsonschema's own check, which takes ~6 s per MB of such schema
        raise too_complex("the JSON schema", "max_schema_bytes", f"{size} bytes of schema text")
    try:
        validator_cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
        if size <= METASCHEMA_CHECK_BYTES:  # (the largest corpus schema, 63 KB, checks in 0.1 s)
            _check_schema(validator_cls, schema)
    except jsonschema.SchemaError as e:
        raise ConstraintError(f"invalid JSON schema: {e.message} at {'/'.join(map(str, e.path)) or 'the root'}") from e
    except RecursionError as e:  # $refs that nest deeper than the stack, within max_schema_depth
        raise too_complex("the JSON schema", "max_schema_depth", "it nests too deeply to check") from e
    # Checked in decimals, as the grammar is: with floats, 0.3 is "not a multiple of 0.1" and could never pass.
    # Patterns run in the `regex` module under a time budget, never in Python's unbounded `re` (pattern_check.py).
    validator = linear_validator(validator_cls, json.loads(text, parse_float=Decimal))

    def parse(text: str) -> Any:
        value = json.loads(text)  # json.JSONDecodeError is a ValueError
        try:
            exact = json.loads(text, parse_float=Decimal)
        except InvalidOperation:  # an exponent past what Decimal holds (1E4316701202...): the float reading
            exact = value
        error = jsonschema.exceptions.best_match(validator.iter_errors(exact))
        if error is not None:
            where = "/".join(map(str, error.absolute_path)) or "the root"
            raise ValueError(f"JSON-schema validation failed at {where}: {error.message}")
        return value

    source = schema if default_json_backend() == "outlines" else llguidance_source(schema, from_pydantic=False)
    return OutputSpec(ConstraintSpec("json", json.dumps(source)), schema, _json_instruction(schema),
                      parse, schema)


def _json_instruction(schema: dict) -> str:
    what = "a JSON object" if schema.get("type") == "object" or "properties" in schema else "a JSON value"
    return f"Answer with {what} matching this JSON schema: {json.dumps(schema)}"


_FENCE = re.compile(r"^\s*```[\w+.-]*[ \t]*\n(.*?)(?:\n?```|$)", re.DOTALL)


def parse_code(text: str, language: str = "python") -> str:
    """The code of the first ``` fence when the text opens with one (chat models follow the block with prose, and
    a stop string may cut the closing fence), else the whole text; for Python, raise SyntaxError unless it parses."""
    m = _FENCE.match(text)
    code = m.group(1) if m else text
    if language.lower() in ("python", "py", "python3"):
        ast.parse(code)
    return code
