"""`if`/`then`/`else` and overlapping `oneOf` rewritten into exact positive schemas (constraints/schema/branches.py):
each form compiles through llguidance, accepts what the ORIGINAL schema accepts (an instance matching two oneOf
branches is rejected), and random walks end only in instances the original schema validates; forms whose negation
has no exact positive form stay refused, naming the keyword and path."""

from __future__ import annotations

import json

import pytest
from test_schema_logic import case_tests, make

from specstruct.constraints.llguidance.json_schema import _grammar, prepare
from specstruct.errors import ConstraintError

AB = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}
KIND = {"type": "object", "properties": {"kind": {"enum": ["x", "y"]}, "n": {"type": "integer"}}}

# (schema, valid instances, invalid instances): each label is checked against `jsonschema` first.
CASES = {
    "oneOf required": ({**AB, "oneOf": [{"required": ["a"]}, {"required": ["b"]}]},
                       [{"a": 1}, {"b": 2}], [{"a": 1, "b": 2}, {}]),
    "oneOf bounds": ({"oneOf": [{"type": "number", "minimum": 2}, {"type": "number", "maximum": 5}]},
                     [1, -3.5, 6, 100], [2, 3, 5, 4.5, "x", None]),
    "oneOf lengths": ({"oneOf": [{"type": "string", "maxLength": 3}, {"type": "string", "minLength": 2}]},
                      ["", "a", "abcd"], ["ab", "abc", 1]),
    "oneOf of three enums": ({"oneOf": [{"enum": ["a", "b"]}, {"enum": ["b", "c"]}, {"type": "string", "maxLength": 0}]},
                             ["a", "c", ""], ["b", "d", 1]),
    "oneOf four": ({"oneOf": [{"type": "number", "maximum": 0}, {"type": "string"}, {"type": "string", "minLength": 3},
                              {"type": "array", "maxItems": 1}]},
                   [-1, "ab", [], [1]], ["abc", None, [1, 2], 1]),
    "oneOf with true": ({"oneOf": [True, {"type": "string"}]}, [1, None, []], ["x", ""]),
    "oneOf with siblings": ({**AB, "required": ["a"], "oneOf": [{"required": ["b"]},
                                                                {"properties": {"a": {"minimum": 5}}}]},
                            [{"a": 1, "b": 1}, {"a": 6}], [{"a": 6, "b": 1}, {"a": 1}, {"b": 1}]),
    # the negated branch must stay open: closed, `not B` would hold for {"a": 1, "b": 2} (an undeclared key a)
    "oneOf negated unclosed": ({"oneOf": [{"type": "object", "required": ["a"]},
                                          {"type": "object", "properties": {"b": {"type": "string"}},
                                           "required": ["b"]}]},
                               [{"a": 1}, {"b": "x"}, {"a": 1, "b": 2}], [{"a": 1, "b": "x"}, {}, 1]),
    "oneOf $ref": ({"definitions": {"pos": {"type": "number", "minimum": 0}, "small": {"type": "number", "maximum": 9}},
                    "oneOf": [{"$ref": "#/definitions/pos"}, {"$ref": "#/definitions/small"}]},
                   [-1, 10, 12.5], [0, 5, 9, "x"]),
    "oneOf nested": ({"type": "object", "properties": {"p": {"oneOf": [{"type": "number", "minimum": 2},
                                                                      {"type": "number", "maximum": 5}]}}},
                     [{}, {"p": 1}, {"p": 7}], [{"p": 3}, {"p": "x"}]),
    "oneOf in oneOf": ({"oneOf": [{"oneOf": [{"type": "number", "minimum": 2}, {"type": "number", "maximum": 5}]},
                                  {"type": "number", "minimum": 10}]},
                       [1, 6, 7.5], [3, 10, 11, "x"]),
    # no `not` needed (`not integer` has no positive form): closed, each branch lacks a key the other requires
    "oneOf excluded by closing": ({"type": "array", "items": {"oneOf": [
        {"type": "object", "required": ["delete"], "properties": {"delete": {"type": "integer"}}},
        {"type": "object", "required": ["insert"], "properties": {"insert": {"type": "integer"}}}]}},
        [[], [{"delete": 1}, {"insert": 2}]], [[{"delete": 1, "insert": 2}], [{}], [1]]),
    # more branches than MAX_ONE_OF, none needing a `not`: told apart by type and by a required const
    "oneOf excluded by type and const": ({"oneOf": [{"type": "null"}] + [
        {"type": "object", "required": ["type"], "properties": {"type": {"const": t}, "n": {"type": "integer"}}}
        for t in ("A", "B", "C", "D", "E")]}, [None, {"type": "A"}, {"type": "E", "n": 3}],
        [{"type": "F"}, {}, 1, {"type": "A", "n": "x"}]),
    # a tagged union whose branches do not say `type: object`: every non-object satisfies both, so fails oneOf
    "oneOf tagged, untyped": ({"oneOf": [{"properties": {"p": {"const": "a"}}, "required": ["p"]},
                                         {"properties": {"p": {"const": "b"}, "q": {"type": "integer"}},
                                          "required": ["p"]}]},
                              [{"p": "a"}, {"p": "b", "q": 1}], [{"p": "c"}, 1, "x", None, [], {}]),
    "if then else": ({"if": {"type": "string"}, "then": {"maxLength": 2}, "else": {"type": "number"}},
                     ["ab", "", 3, 2.5], ["abc", None, []]),
    "if then else objects": ({**KIND, "if": {"properties": {"kind": {"const": "x"}}}, "then": {"required": ["n"]},
                              "else": {"properties": {"n": {"maximum": 3}}}},
                             [{"kind": "x", "n": 9}, {"kind": "y"}, {"kind": "y", "n": 2}, {"n": 1}],
                             [{"kind": "x"}, {"kind": "y", "n": 5}, {}]),
    "if then": ({**AB, "if": {"properties": {"a": {"const": 1}}, "required": ["a"]}, "then": {"required": ["b"]}},
                [{}, {"a": 2}, {"b": 3}, {"a": 1, "b": 3}], [{"a": 1}]),
    "if else": ({"type": "string", "if": {"pattern": "^a"}, "else": {"maxLength": 2}},  # no negation needed
                ["abcd", "a", "xy", ""], ["xyz", "bbbb"]),
    "if alone": ({"type": "integer", "if": {"minimum": 3}}, [1, 5], ["x"]),
    "if nested and in definitions": (
        {"definitions": {"d": {"if": {"type": "number"}, "then": {"minimum": 0}, "else": {"type": "string"}}},
         "type": "object", "properties": {"p": {"$ref": "#/definitions/d"},
                                          "q": {"if": {"maxLength": 1}, "then": {"type": "string"}}}},
        [{"p": 3}, {"p": "x"}, {"q": "a"}, {"q": "abc"}], [{"p": -1}, {"p": None}, {"q": 5}, {"q": []}]),
    "oneOf inside then": ({"if": {"type": "number"}, "then": {"oneOf": [{"minimum": 5}, {"maximum": 6}]},
                           "else": {"type": "string"}},
                          [7, 4, "x"], [5, 6, None]),
}

REFUSED = {  # (subschema, keyword named)
    "oneOf with a pattern branch": ({"oneOf": [{"type": "string", "pattern": "^a"}, {"type": "string", "maxLength": 2}]},
                                    "oneOf"),
    "oneOf with an open closed branch": ({"oneOf": [{"type": "object", "additionalProperties": False},
                                                    {"type": "object"}]}, "oneOf"),
    "if of a pattern, with then": ({"type": "string", "if": {"pattern": "^a"}, "then": {"maxLength": 2}}, "if"),
    "if of integers": ({"if": {"type": "integer"}, "then": {"minimum": 2}, "else": {"type": "string"}}, "if"),
    "if inside an overlapping oneOf": ({"oneOf": [{"if": {"type": "string"}, "then": {"minLength": 2}},
                                                  {"type": "string", "maxLength": 3}]}, "oneOf"),
}


test_rewrite_accepts_valid_and_rejects_invalid, test_random_walks_end_only_in_instances_of_the_original_schema = \
    case_tests(CASES)


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_forms_without_an_exact_rewrite_stay_refused_naming_keyword_and_path(tok, name):
    schema, keyword = REFUSED[name]
    with pytest.raises(ConstraintError, match=rf"'{keyword}' at #/properties/p"):
        make(tok, {"type": "object", "properties": {"p": schema}})


def test_a_oneof_of_more_branches_than_the_limit_is_refused_naming_the_limit(tok):
    branches = [{"type": "number", "minimum": i} for i in range(5)]
    with pytest.raises(ConstraintError, match=r"'oneOf' at #/properties/p.*MAX_ONE_OF=4 branches.*this one has 5"):
        make(tok, {"type": "object", "properties": {"p": {"oneOf": branches}}})


def test_a_oneof_llguidance_proves_disjoint_is_compiled_as_written():
    schema = {"oneOf": [{"type": "string"}, {"type": "integer"}]}
    prepared, _, error = _grammar(json.dumps(schema))
    assert not error and prepared["oneOf"] == schema["oneOf"] and "allOf" not in prepared


def test_the_positive_branch_is_closed_and_the_negated_one_is_not():
    schema = CASES["oneOf negated unclosed"][0]
    first, second = prepare(schema, one_of=True)["allOf"][0]["anyOf"]
    assert second["additionalProperties"] is False  # B itself: closed as before (so it excludes A's required key)
    assert first["allOf"][0] == schema["oneOf"][0]  # A, with `not B` from B as written, not closed:
    assert "additionalProperties" not in json.dumps(first["allOf"][1:]) and "b" in json.dumps(first["allOf"][1:])


def test_keys_that_then_or_else_declare_keep_the_object_open(tok):
    """Closing the object to its own properties would forbid `c`, which `then` requires: no `a: 1` at all."""
    schema = {**AB, "if": {"properties": {"a": {"const": 1}}, "required": ["a"]},
              "then": {"properties": {"c": {"type": "string"}}, "required": ["c"]}}
    assert "additionalProperties" not in prepare(schema)
    c = make(tok, schema)
    assert c.accepts('{"a": 1, "c": "x"}') and not c.accepts('{"a": 1}') and c.accepts('{"a": 2}')
