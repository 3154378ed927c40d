"""Hostile schemas, grammars and stop lists: each is refused with an error naming the problem, or handled in
bounded time, instead of holding the process."""

from __future__ import annotations

import json
import time

import pytest

from specstruct.constraints import limits as L
from specstruct.errors import ConstraintError
from specstruct.types.output import resolve


def test_backtracking_pattern_is_checked_in_bounded_time():
    # with Python's `re` this value takes minutes (exponential backtracking: 2 s at 36 characters, x1.6 per one
    # more); the check takes a fraction of a second, so a bound of 10 s holds on a busy machine and still tells them
    spec = resolve({"type": "string", "pattern": "^(?:(a|aa)+b)?a{46}$", "maxLength": 46})
    start = time.monotonic()
    assert spec.parse(json.dumps("a" * 46)) == "a" * 46
    assert time.monotonic() - start < 10.0


def test_pattern_check_still_rejects_a_mismatch():
    spec = resolve({"type": "string", "pattern": "^ab+$"})
    with pytest.raises(ValueError, match="does not match"):
        spec.parse(json.dumps("ac"))
    obj = resolve({"type": "object", "patternProperties": {"^x": {"type": "integer"}}, "additionalProperties": False})
    assert obj.parse('{"x1": 1}') == {"x1": 1}
    with pytest.raises(ValueError):
        obj.parse('{"x1": "no"}')
    with pytest.raises(ValueError, match="additional properties"):
        obj.parse('{"y": 1}')


def test_lone_surrogate_property_is_named():
    schema = {"type": "object", "properties": {"\ud800": {"type": "integer"}}, "required": ["\ud800"]}
    with pytest.raises(ConstraintError, match="lone surrogate") as e:
        resolve(schema)
    assert "numeric bound" not in str(e.value)
    with pytest.raises(ConstraintError, match="lone surrogate"):
        L.check_schema({"enum": ["ok", "\udfff"]})
