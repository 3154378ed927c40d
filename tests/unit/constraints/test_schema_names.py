"""`propertyNames` rewritten into object keywords llguidance has (constraints/schema_names.py): each form accepts what
the original schema accepts (checked against `jsonschema`) and rejects what it rejects, random walks end only in
instances of the original; forms without an exact rewrite stay refused. Pydantic dicts keyed by Literal, Enum or int
compile and keep their keys."""

from __future__ import annotations

import enum
from typing import Literal

import pytest
from pydantic import BaseModel

from specstruct.errors import ConstraintError
from test_schema_logic import case_tests, make

INT = {"type": "integer"}
CASES = {
    "enum": ({"type": "object", "propertyNames": {"enum": ["a", "b"]}, "additionalProperties": INT},
             [{}, {"a": 1}, {"a": 1, "b": 2}], [{"c": 1}, {"a": "x"}]),
    "const": ({"type": "object", "propertyNames": {"const": "k"}}, [{"k": [1]}, {}], [{"j": 1}]),
    "enum with declared and pattern properties": (
        {"type": "object", "properties": {"a": {"type": "string"}, "z": INT}, "required": ["a"],
         "patternProperties": {"^b": {"type": "boolean"}}, "propertyNames": {"enum": ["a", "b1", "c"]},
         "additionalProperties": INT},
        [{"a": "x"}, {"a": "x", "b1": True, "c": 3}], [{}, {"a": "x", "z": 1}, {"a": "x", "b1": 1}, {"a": "x", "c": "y"}]),
    "pattern": ({"type": "object", "propertyNames": {"pattern": "^[0-9]+$"}, "additionalProperties": {"type": "string"}},
                [{}, {"1": "x", "22": "y"}], [{"a": "x"}, {"1": 2}]),
    "pattern drops a declared key it does not match": (
        {"type": "object", "properties": {"ab": INT, "9": INT}, "propertyNames": {"pattern": "^[0-9]$"}},
        [{"9": 1}, {"8": "free"}], [{"ab": 1}, {"9": "x"}, {"10": 1}]),
    "false": ({"type": "object", "propertyNames": False}, [{}], [{"a": 1}]),
    "true": ({"type": "object", "propertyNames": True, "additionalProperties": INT}, [{"a": 1}], [{"a": "x"}]),
    "$ref to an enum": ({"$defs": {"C": {"type": "string", "enum": ["red", "blue"]}}, "type": "object",
                         "propertyNames": {"$ref": "#/$defs/C"}}, [{"red": 1}], [{"green": 1}]),
}


test_rewrite_accepts_valid_and_rejects_invalid, test_random_walks_end_only_in_instances_of_the_original_schema = \
    case_tests(CASES)


@pytest.mark.parametrize("names", [{"maxLength": 3}, {"not": {"const": "a"}}, {"format": "email"}])
def test_forms_without_an_exact_rewrite_stay_refused(tok, names):
    with pytest.raises(ConstraintError, match="propertyNames"):
        make(tok, {"type": "object", "propertyNames": names})


def test_pydantic_dicts_keyed_by_literal_enum_or_int():
    from specstruct.testing import scripted_engine

    class Colour(str, enum.Enum):
        red = "red"
        blue = "blue"

    class Scores(BaseModel):
        by_id: dict[int, float]
        by_colour: dict[Colour, int] = {}
        by_name: dict[Literal["x", "y"], str] = {}

    text = '{"by_id": {"3": 1.5}, "by_colour": {"red": 1}}'
    engine = scripted_engine(text, max_new_tokens=40)
    c = engine.constraint(Scores)
    assert c.accepts('{"by_id": {"3": 1.5, "-2": 0.5}, "by_colour": {"red": 1}, "by_name": {"y": "a"}}')
    for bad in ('{"by_id": {"three": 1.5}}', '{"by_id": {"03": 1.5}}', '{"by_id": {}, "by_colour": {"green": 1}}',
                '{"by_id": {}, "by_name": {"z": "a"}}'):
        assert not c.accepts(bad), bad
    value = engine.generate("Scores:", Scores)
    assert value.by_id == {3: 1.5} and value.by_colour == {Colour.red: 1}


def test_pydantic_dicts_keyed_by_int_enum_uuid_date_bool_or_float():
    """Pydantic writes no propertyNames for bool/float keys, and for IntEnum/UUID/date one a key string never
    satisfies (a type or format): each gets keys a grammar enforces and Pydantic parses."""
    import datetime
    import uuid

    from specstruct.testing import scripted_engine

    class Level(enum.IntEnum):
        LOW = 1
        HIGH = 2

    engine = scripted_engine("{}", max_new_tokens=4)
    for output_type, yes, no in ((dict[Level, int], '{"1": 2}', '{"3": 2}'),
                                 (dict[uuid.UUID, int], '{"12345678-1234-5678-1234-567812345678": 1}', '{"x": 1}'),
                                 (dict[datetime.date, int], '{"2024-01-31": 1}', '{"2024-1-31": 1}'),
                                 (dict[bool, int], '{"true": 1}', '{"yes": 1}'),
                                 (dict[float, int], '{"1.5": 1, "2e3": 2}', '{"a": 1}')):
        c = engine.constraint(output_type)
        assert c.accepts(yes) and not c.accepts(no), output_type


def test_key_types_with_their_own_bounds_are_left_to_pydantic_and_int_literals_are_listed(tok):
    from pydantic import PositiveInt

    from specstruct.types.output import resolve

    assert "propertyNames" not in resolve(dict[PositiveInt, int]).json_schema  # "-1" would pass a pattern
    from pydantic import StrictInt

    assert "pattern" in resolve(dict[StrictInt, int]).json_schema["propertyNames"]  # strict is no bound
    with pytest.raises(ConstraintError, match=r"dict keys of type Literal\[1, 2\]: Pydantic reads JSON keys as strings"):
        resolve(dict[Literal[1, 2], int])  # Pydantic never validates "1" as the key 1: only {} would
    assert resolve(dict[Literal[1, "a"], int]).json_schema["propertyNames"] == {"enum": ["a"]}
    ref_with_sibling = {"$defs": {"K": {"enum": ["a", "bb"]}}, "type": "object",
                        "propertyNames": {"$ref": "#/$defs/K", "maxLength": 1}}
    with pytest.raises(ConstraintError, match="propertyNames"):  # not rewritten: the sibling would be lost
        make(tok, ref_with_sibling)
