"""Output types: each resolves to the right mode/spec, compiles, and parses its own canonical text back."""

from __future__ import annotations

import dataclasses
import datetime
import decimal
import enum
import ipaddress
import json
import uuid
from decimal import Decimal
from typing import Annotated, Literal, Optional, TypedDict, Union

import pydantic
import pytest
from pydantic import BaseModel, Field

from specstruct.constraints.compiler import compile_constraint
from specstruct.errors import ConstraintError
from specstruct.types.output import Choice, Code, Grammar, Regex, parse_code, resolve


class Address(BaseModel):
    city: str
    country: str


class Person(BaseModel):
    name: str
    age: int = Field(ge=0, description="years")
    email: Optional[str] = None
    address: Address | None = None
    tags: list[str] = []


class Color(enum.Enum):
    RED = "red"
    GREEN = "green"


class Level(enum.IntEnum):
    LOW = 1
    HIGH = 2


class Movie(TypedDict):
    title: str
    year: int


@dataclasses.dataclass
class Point:
    x: float
    y: float
    label: str = ""


def compiled(tok, out):
    return compile_constraint(out.spec, tok, vocab_size=408, eos_token_ids=[tok.eos_token_id])


# (output type, mode, canonical text, expected value)
CASES = [
    (None, "text", "anything at all", "anything at all"),
    (str, "text", "hi", "hi"),
    (Person, "json", json.dumps({"name": "Ada", "age": 36, "email": None, "address": {"city": "London",
     "country": "UK"}, "tags": ["math"]}), Person(name="Ada", age=36, address=Address(city="London", country="UK"),
                                               tags=["math"])),
    (list[Address], "json", json.dumps([{"city": "Paris", "country": "France"}]),
     [Address(city="Paris", country="France")]),
    (Movie, "json", json.dumps({"title": "Alien", "year": 1979}), {"title": "Alien", "year": 1979}),
    (Point, "json", json.dumps({"x": 1.5, "y": -2.0}), Point(1.5, -2.0)),
    (int, "json", "42", 42),
    (float, "json", "3.25", 3.25),
    (bool, "json", "true", True),
    (Literal["positive", "negative"], "choice", "negative", "negative"),
    (Literal[1, 2], "json", "2", 2),
    (Color, "choice", "green", Color.GREEN),
    (Level, "json", "2", Level.HIGH),
    ({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}, "json", '{"n": 5}', {"n": 5}),
    (Regex(r"[0-9]{4}-[0-9]{2}"), "regex", "2024-01", "2024-01"),
    (Choice(["yes", "no"]), "choice", "yes", "yes"),
    (Grammar('start: "ok " NUM\nNUM: /[0-9]+/'), "grammar", "ok 12", "ok 12"),
    (Code("python"), "code", "def f():\n    return 1\n", "def f():\n    return 1\n"),
]


@pytest.mark.parametrize("output_type, mode, text, value", CASES, ids=[str(c[0])[:40] for c in CASES])
def test_every_output_type_resolves_compiles_accepts_and_parses(tok, output_type, mode, text, value):
    out = resolve(output_type)
    assert out.mode == mode == out.spec.mode
    assert out.parse(text) == value
    constraint = compiled(tok, out)
    assert constraint.mode == mode
    assert constraint.accepts(text), f"the automaton must accept the canonical text {text!r}"
    if mode not in ("text", "code"):
        assert out.instruction  # the model is told what to write
    if mode == "json":
        assert out.json_schema is not None


class Order(BaseModel):
    quantity: int = Field(ge=1, le=99)
    price: float = Field(ge=0)
    batch: int = Field(multiple_of=5)


def test_bounds_of_a_pydantic_model_are_guaranteed(tok):
    out = resolve(Order)
    constraint = compiled(tok, out)
    assert constraint.accepts('{"quantity": 3, "price": 9.5, "batch": 10}')
    assert not constraint.accepts('{"quantity": 0, "price": 9.5, "batch": 10}')    # ge=1
    assert not constraint.accepts('{"quantity": 100, "price": 9.5, "batch": 10}')  # le=99
    assert not constraint.accepts('{"quantity": 3, "price": -1.0, "batch": 10}')   # ge=0
    assert not constraint.accepts('{"quantity": 3, "price": 1.0, "batch": 7}')     # multiple_of=5


class Strict(BaseModel):
    code: Annotated[str, pydantic.StringConstraints(pattern=r"^[A-Z]{2}$")]
    p: float = Field(gt=0, lt=1)
    ip: ipaddress.IPv4Address
    amount: Decimal


@pytest.mark.parametrize("text, ok", [
    ('{"code": "US", "p": 0.5, "ip": "10.0.0.1", "amount": "1.25"}', True),
    ('{"code": "US", "p": 0.5, "ip": "10.0.0.1", "amount": 3}', True),
    ('{"code": "USA", "p": 0.5, "ip": "10.0.0.1", "amount": "1"}', False),  # anchors kept (they were stripped,
    ('{"code": "xUS", "p": 0.5, "ip": "10.0.0.1", "amount": "1"}', False),  # and llguidance's pattern searches)
    ('{"code": "US", "p": 5, "ip": "10.0.0.1", "amount": "1"}', False),     # gt/lt on a float (were dropped)
    ('{"code": "US", "p": 0, "ip": "10.0.0.1", "amount": "1"}', False),
    ('{"code": "US", "p": 0.5, "ip": "hello", "amount": "1"}', False),      # format ipv4 (was dropped)
    ('{"code": "US", "p": 0.5, "ip": "10.0.0.1", "amount": "."}', False),   # Decimal's pattern, look-ahead free
])
def test_what_a_pydantic_model_says_is_enforced_while_decoding_as_for_its_schema_dict(tok, text, ok):
    """Found by probing: the Pydantic path still went through the outlines-era relaxation (anchors stripped,
    unsupported formats and float bounds dropped) while the same schema as a dict was enforced."""
    assert compiled(tok, resolve(Strict)).accepts(text) is ok
    assert compiled(tok, resolve(Strict.model_json_schema())).accepts(text) is ok or '"."' in text


def test_a_schema_dicts_multiple_of_is_checked_in_decimals():
    out = resolve({"type": "number", "multipleOf": 0.1})
    assert out.parse("0.3") == 0.3 and out.parse("0.7") == 0.7  # floats said 0.3 % 0.1 != 0: never valid
    with pytest.raises(ValueError):
        out.parse("0.35")
    assert resolve({"type": "number"}).parse("3E4316701202000089167843754892331") == float("inf")  # past Decimal


def test_schema_dict_is_checked_with_jsonschema_and_strict_at_compile_time(tok):
    out = resolve({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]})
    with pytest.raises(ValueError, match="required"):
        out.parse("{}")
    with pytest.raises(ValueError):
        out.parse("{not json")
    with pytest.raises(ConstraintError, match="'not' at #"):
        compiled(tok, resolve({"type": "integer", "not": {"multipleOf": 3}}))
    with pytest.raises(ConstraintError, match="invalid JSON schema"):
        resolve({"type": 12})
    deep = json.loads('{"type": "array", "items": ' * 200 + "{}" + "}" * 200)  # jsonschema's check would recurse
    with pytest.raises(ConstraintError, match="max_schema_depth"):
        resolve(deep)


def test_choice_parse_rejects_other_text():
    with pytest.raises(ValueError):
        resolve(Choice(["a", "b"])).parse("c")
    with pytest.raises(ValueError):
        resolve(Color).parse("blue")
    with pytest.raises(ConstraintError):
        resolve(Choice([]))


def test_code_strips_fence_and_checks_python():
    assert parse_code("```python\nx = 1\n```") == "x = 1"
    assert parse_code("```\nprint(2)\n```\n") == "print(2)"
    with pytest.raises(SyntaxError):
        resolve(Code("python")).parse("def broken(:\n")
    assert resolve(Code("sql")).parse("SELECT 1 FROM") == "SELECT 1 FROM"  # only Python is parsed


@pytest.mark.parametrize("bad", [object(), 3, Person(name="a", age=1), lambda: 1])
def test_unsupported_output_types_raise(bad):
    with pytest.raises(ConstraintError, match="unsupported output type"):
        resolve(bad)


def test_markers_are_plain_values():
    assert Choice(["a", "b"]) == Choice(("a", "b")) and hash(Choice(["a"])) == hash(Choice(("a",)))
    assert Regex("x") == Regex("x") and Code().language == "python"
    assert Grammar("start: x").lark == "start: x"


class Cat(BaseModel):
    kind: Literal["cat"]
    lives: int = Field(ge=0, le=9)


class Dog(BaseModel):
    kind: Literal["dog"]
    good: bool = True


class Rich(BaseModel):
    when: datetime.datetime
    day: datetime.date
    id: uuid.UUID
    color: Color = Color.RED
    address: Optional[Address] = None
    tags: set[str] = set()
    scores: dict[str, float] = {}
    pet: Union[Cat, Dog] = Field(discriminator="kind")
    pair: tuple[int, str]
    price: decimal.Decimal = decimal.Decimal(0)


def test_rich_pydantic_model_round_trips(tok):
    value = Rich(when=datetime.datetime(2024, 1, 2, 3, 4, 5, tzinfo=datetime.timezone.utc), day=datetime.date(2024, 1, 2),
                 id=uuid.UUID(int=7), pet=Cat(kind="cat", lives=3), pair=(1, "a"),
                 address=Address(city="Oslo", country="NO"), tags={"x"}, scores={"a": 0.5})
    text = json.dumps(json.loads(value.model_dump_json()), ensure_ascii=False)
    out = resolve(Rich)
    assert compiled(tok, out).accepts(text)  # Decimal's look-ahead pattern is left to Pydantic
    assert out.parse(text) == value


@pytest.mark.parametrize("t, text, value", [
    (datetime.date, '"2024-01-31"', datetime.date(2024, 1, 31)),
    (uuid.UUID, f'"{uuid.UUID(int=1)}"', uuid.UUID(int=1)),
    (Optional[int], "null", None),
])
def test_plain_python_types(tok, t, text, value):
    out = resolve(t)
    assert out.mode == "json" and compiled(tok, out).accepts(text) and out.parse(text) == value


def test_a_discriminated_unions_tag_is_required_even_with_a_default(tok):
    """Found by probing: Pydantic leaves a defaulted tag out of `required`, so the grammar let the model omit it,
    and Pydantic (which needs the tag to pick the branch) then rejected every such output."""
    from typing_extensions import Annotated

    class Cat(BaseModel):
        kind: Literal["cat"] = "cat"
        lives: int

    class Dog(BaseModel):
        kind: Literal["dog"] = "dog"
        name: str

    pet = Annotated[Union[Cat, Dog], Field(discriminator="kind")]
    c = compiled(tok, resolve(pet))
    assert c.accepts('{"kind": "cat", "lives": 9}') and not c.accepts('{"lives": 9}')
    assert compiled(tok, resolve(Cat)).accepts('{"lives": 9}')  # outside the union the tag keeps its default


def test_pydantic_datetimes_and_times_may_be_naive_and_dicts_keep_rfc3339(tok):
    """llguidance's date-time/time formats (RFC 3339) require an offset: a datetime always came back tz-aware and
    pydantic.NaiveDatetime could never validate. A schema dict keeps RFC 3339."""
    for output_type, naive, aware, wrong in (
            (datetime.datetime, '"2024-01-31T12:30:00"', '"2024-01-31T12:30:00.5+02:00"', '"2024-13-31T12:30:00"'),
            (datetime.time, '"12:30:00"', '"12:30:00Z"', '"25:30:00"'),
            (datetime.datetime, '"2024-02-29T12:30:00"', '"2024-04-30T10:00:00Z"', '"2024-04-31T10:00:00Z"')):
        out = resolve(output_type)
        c = compiled(tok, out)
        assert c.accepts(naive) and c.accepts(aware) and not c.accepts(wrong), output_type
    assert not compiled(tok, resolve(datetime.datetime)).accepts('"0000-01-01T00:00:00"')  # year 0 never validates
    naive_only, aware_only = compiled(tok, resolve(pydantic.NaiveDatetime)), compiled(tok, resolve(pydantic.AwareDatetime))
    assert naive_only.accepts('"2024-01-31T12:30:00"') and not naive_only.accepts('"2024-01-31T12:30:00Z"')
    assert aware_only.accepts('"2024-01-31T12:30:00Z"') and not aware_only.accepts('"2024-01-31T12:30:00"')
    assert resolve(datetime.datetime).parse('"2024-01-31T12:30:00"').tzinfo is None
    strict = compiled(tok, resolve({"type": "string", "format": "date-time"}))
    assert not strict.accepts('"2024-01-31T12:30:00"') and strict.accepts('"2024-01-31T12:30:00Z"')


def test_what_pydantic_validates_is_what_the_grammar_writes():
    """Found by probing: keys by field name when a model validates by name only; a field read from a path is
    refused by name; Literal of Enum members returns the members; a compiled regex keeps its flags."""
    import re

    from pydantic import AliasPath, ConfigDict

    class ByName(BaseModel):
        model_config = ConfigDict(validate_by_alias=False, validate_by_name=True)
        name: str = Field(alias="N")

    assert list(resolve(ByName).json_schema["properties"]) == ["name"]

    class FromPath(BaseModel):
        x: int = Field(validation_alias=AliasPath("outer", 0))

    with pytest.raises(ConstraintError, match="field 'x' of FromPath reads its value from a path"):
        resolve(FromPath)

    class Colour(str, enum.Enum):
        RED = "red"
        GREEN = "green"

    class Plain(enum.Enum):
        RED = "red"

    assert resolve(Literal[Colour.RED, Colour.GREEN]).parse("green") is Colour.GREEN
    assert resolve(Literal[Plain.RED]).parse("red") is Plain.RED
    assert Regex(re.compile("abc", re.I | re.S)).pattern == "(?i)(?s)abc"
    assert Regex(re.compile(r"\d", re.A)).pattern == "[0-9]"
    with pytest.raises(ConstraintError, match="MULTILINE"):
        Regex(re.compile("^a$", re.M))


def test_compiled_regex_flags_hold_while_decoding(tok):
    import re

    for pattern, yes, no in ((re.compile("abc", re.I), "ABC", "abd"), (re.compile(r"\d+", re.A), "12", "٣"),
                             (re.compile(r"a.b", re.S), "a\nb", "ab"), (re.compile("a[^x]b", re.A), "aéb", "axb"),
                             (re.compile("[ a]+  # a or space", re.X), "a a", "b"), (re.compile("[#a]+", re.X), "#a", "b"),
                             (re.compile(r"[\w.]+\W", re.A), "ab.!", "ab.c"),
                             (re.compile(r"a\sb [a-c\s]", re.A | re.X), "a bc", "abc")):
        assert bool(pattern.fullmatch(yes)) and not pattern.fullmatch(no)  # Python's own meaning
        c = compiled(tok, resolve(Regex(pattern)))
        assert c.accepts(yes) and not c.accepts(no), pattern


def test_bounds_beyond_what_the_grammar_builds_are_left_to_pydantic_and_named_in_a_dict(tok):
    class Wide(BaseModel):
        a: float = Field(le=1e20)
        b: int = Field(ge=-(2**63), le=2**63 - 1)
        c: float = Field(gt=1e-300)
        d: int = Field(ge=0, le=10)

    c = compiled(tok, resolve(Wide))
    assert c.accepts('{"a": 1.5, "b": 3, "c": 0.5, "d": 3}') and not c.accepts('{"a": 1.5, "b": 3, "c": 0.5, "d": 11}')
    with pytest.raises(pydantic.ValidationError):
        resolve(Wide).parse('{"a": 1e21, "b": 3, "c": 0.5, "d": 3}')  # the validator still holds the bound
    for schema in ({"type": "number", "minimum": 1e300}, {"type": "integer", "minimum": -(2**63)},
                   {"type": "number", "exclusiveMinimum": 1e-300}):
        with pytest.raises(ConstraintError, match="numeric bound .* beyond what the grammar can express"):
            compiled(tok, resolve(schema))


def test_aliases_are_checked_in_nested_models_too():
    from pydantic import AliasPath, ConfigDict

    class Inner(BaseModel):
        x: int = Field(validation_alias=AliasPath("outer", 0))

    class Outer(BaseModel):
        items: list[Inner]

    for output_type in (Outer, list[Inner]):
        with pytest.raises(ConstraintError, match="field 'x' of Inner reads its value from a path"):
            resolve(output_type)

    class ByName(BaseModel):
        model_config = ConfigDict(validate_by_alias=False, validate_by_name=True)
        n: str = Field(alias="N")

    class Parent(BaseModel):  # no aliases of its own: keyed as its child validates
        child: ByName

    assert list(resolve(Parent).json_schema["$defs"]["ByName"]["properties"]) == ["n"]

    class AliasedParent(BaseModel):
        child: ByName = Field(alias="Child")

    with pytest.raises(ConstraintError, match="disagree on validate_by_alias"):
        resolve(AliasedParent)

    class Plain(BaseModel):  # no aliases: its keys are the same either way
        m: int

    class ByNameAround(BaseModel):
        model_config = ConfigDict(validate_by_alias=False, validate_by_name=True)
        n: str = Field(alias="N")
        plain: Plain

    assert list(resolve(ByNameAround).json_schema["properties"]) == ["n", "plain"]
    assert list(resolve(list[ByName]).json_schema["$defs"]["ByName"]["properties"]) == ["n"]  # by name, as validated
