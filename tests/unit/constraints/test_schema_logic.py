"""`not` and `dependencies` rewritten into exact positive schemas (constraints/schema/logic.py): each form compiles
through llguidance, accepts what the ORIGINAL schema accepts, rejects what it rejects, and random walks of the
automaton end only in instances the original schema validates; forms without an exact rewrite stay refused."""

from __future__ import annotations

import json
import random
import re

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specstruct.bench.conformance import serialise
from specstruct.constraints.base import ConstraintSpec
from specstruct.constraints.compiler import compile_constraint
from specstruct.constraints.llguidance.json_schema import prepare
from specstruct.constraints.schema.logic import _complement
from specstruct.errors import ConstraintError

OBJ = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}}}
WORDS = ["foo", "fo", "bar", "", "é😀", "a\nb"]

# (schema, valid instances, invalid instances): each label is checked against `jsonschema` first.
CASES = {
    "not not": ({"not": {"not": {"type": "string"}}}, ["x"], [1, None]),
    "not {}": ({"type": "object", "properties": {"a": {"not": {}}, "b": {"type": "integer"}}},
               [{}, {"b": 1}], [{"a": 1}, {"a": None, "b": 1}]),
    "not true": ({"type": "object", "properties": {"a": {"not": True}}}, [{}], [{"a": 1}]),
    "not false": ({"type": "integer", "not": False}, [3], ["x"]),
    "not type": ({"not": {"type": "null"}}, [1, "x", [], {}, True, 1.5], [None]),
    "not type list": ({"not": {"type": ["number", "string"]}}, [None, [], {}, False], [1, 1.5, "x"]),
    "not number": ({"not": {"type": "number"}}, ["1", None], [1, 2.5]),
    "not required": ({**OBJ, "not": {"required": ["a"]}}, [{}, {"b": "x"}], [{"a": 1}, {"a": 1, "b": "x"}]),
    "not required untyped": ({"properties": OBJ["properties"], "not": {"required": ["a"]}}, [{}, {"b": "x"}],
                             [{"a": 1}, 1, None]),
    "not required 2": ({**OBJ, "not": {"required": ["a", "b"]}}, [{}, {"a": 1}, {"b": "x"}], [{"a": 1, "b": "x"}]),
    "not anyOf": ({"not": {"anyOf": [{"type": "string"}, {"type": "null"}]}}, [1, True, []], ["x", None]),
    "not allOf": ({"type": "integer", "not": {"allOf": [{"minimum": 3}, {"maximum": 5}]}},
                  [2, 6, -10], [3, 4, 5]),
    "not $ref": ({"definitions": {"s": {"type": "string"}}, "not": {"$ref": "#/definitions/s"}},
                 [1, None, {}], ["x"]),
    "not enum strings": ({"not": {"enum": WORDS}},
                         ["f", "foox", "ba", "barr", "é", "😀", "a\n", "x", 1, None],
                         ["foo", "fo", "bar", "", "é😀", "a\nb"]),
    "not enum mixed": ({"not": {"enum": [6, "foo", [], True, {}, None]}},
                       [5, 6.5, -1, "fo", [1], False, {"a": 1}], [6, 6.0, "foo", [], True, {}, None]),
    "not enum of arrays and objects": ({"not": {"enum": [[1, "a"], {"a": [True]}, []]}},
                                       [[1], [1, "b"], [1, "a", 2], [2, "a"], {"a": [False]}, {"a": [True], "b": 1},
                                        {}, {"b": [True]}, {"a": []}, 1, "x"],
                                       [[1, "a"], [1.0, "a"], {"a": [True]}, []]),
    "not oneOf": ({"not": {"oneOf": [{"type": "string"}, {"maxLength": 2}]}}, ["", "ab"], ["abc", 1, None]),
    "not const number": ({"not": {"const": 2.5}}, [2, 3, -2.5, "2.5"], [2.5]),
    "not const bool": ({"not": {"const": True}}, [False, None, 1], [True]),
    "not minimum": ({"not": {"minimum": 3}}, [2, -1, 2.5], [3, 4, 10, "x"]),
    "not exclusiveMaximum": ({"type": "integer", "not": {"exclusiveMaximum": 3}}, [3, 4], [2, -1]),
    "not minLength": ({"not": {"minLength": 2}}, ["a", ""], ["ab", "abc", 12]),
    "not maxLength": ({"not": {"maxLength": 2}}, ["abc"], ["ab", "", 12]),
    "not minLength 0": ({"type": "object", "properties": {"a": {"not": {"minLength": 0}}}}, [{}],
                        [{"a": ""}, {"a": 1}]),
    "not maxItems": ({"not": {"maxItems": 1}}, [[1, 2]], [[], [1], "x"]),
    "not minProperties": ({"not": {"minProperties": 1}}, [{}], [{"a": 1}, 3]),
    "not properties": ({"properties": {"a": {"type": "integer"}}, "not": {"properties": {"a": {"minimum": 3}}}},
                       [{"a": 1}, {"a": -5}], [{"a": 3}, {}, 1]),
    "not contains": ({"type": "array", "items": {"type": ["integer", "string"]},
                      "not": {"contains": {"type": "string"}}}, [[], [1, 2]], [["a"], [1, "b"]]),
    "not contains untyped": ({"not": {"contains": {"type": "string"}}}, [[1], []], [["a"], "x", 1]),
    "not items false": ({"not": {"items": False}}, [[1], [[]]], [[], "x"]),
    "not keywords": ({"not": {"type": "string", "maxLength": 3}}, ["abcd", 1, None], ["", "abc"]),
    "dependencies array": ({**OBJ, "properties": {**OBJ["properties"], "c": {"type": "null"}},
                            "dependencies": {"a": ["b", "c"]}},
                           [{}, {"b": "x"}, {"a": 1, "b": "x", "c": None}], [{"a": 1}, {"a": 1, "b": "x"}]),
    "dependentRequired": ({**OBJ, "dependentRequired": {"b": ["a"]}}, [{}, {"a": 1}, {"a": 1, "b": "x"}],
                          [{"b": "x"}]),
    "dependencies schema": ({**OBJ, "dependencies": {"a": {"properties": {"b": {"maxLength": 1}}, "required": ["b"]}}},
                            [{}, {"b": "xyz"}, {"a": 1, "b": "x"}], [{"a": 1}, {"a": 1, "b": "xy"}]),
    "dependentSchemas false": ({**OBJ, "dependentSchemas": {"a": False}}, [{}, {"b": "x"}], [{"a": 1}]),
    "dependencies with not": ({**OBJ, "dependencies": {"a": {"not": {"required": ["b"]}}}},
                              [{"a": 1}, {"b": "x"}], [{"a": 1, "b": "x"}]),
}

REFUSED = {
    "not integer": {"not": {"type": "integer"}},
    "not pattern": {"not": {"pattern": "^a"}},
    "not multipleOf": {"not": {"multipleOf": 2}},
    "not oneOf": {"not": {"oneOf": [{"type": "integer"}, {"minimum": 2}]}},
    "not additionalProperties": {"not": {"additionalProperties": False}},
    "not enum with a quote": {"not": {"enum": ['a"b']}},
    "not enum of an array with a quote": {"not": {"enum": [['"']]}},
    "not oneOf of five": {"not": {"oneOf": [{"type": "string"}] * 5}},
    "not recursive $ref": {"definitions": {"r": {"properties": {"a": {"$ref": "#/properties/p/definitions/r"}}}},
                           "not": {"$ref": "#/properties/p/definitions/r"}},
    "not a $ref to its own negation": {"definitions": {"r": {"not": {"$ref": "#/properties/p/definitions/r"}}},
                                       "not": {"$ref": "#/properties/p/definitions/r"}},
    "not $ref with a sibling": {"definitions": {"s": {"type": "string"}},
                                "not": {"$ref": "#/properties/p/definitions/s", "minLength": 2}},
}


def validator(schema):
    """Draft 7 for `dependencies` (2020-12 dropped it for dependentRequired/dependentSchemas), else 2020-12."""
    draft = jsonschema.Draft7Validator if "dependencies" in schema else jsonschema.Draft202012Validator
    return draft(schema)


def make(tok, schema):
    return compile_constraint(ConstraintSpec("json", json.dumps(schema)), tok, vocab_size=408,
                              eos_token_ids=[tok.eos_token_id])


def case_tests(cases: dict) -> tuple:
    """The two tests every rewrite's CASES get (here, in test_schema_branches and test_schema_names): labels agree
    with `jsonschema` and the automaton with them; random walks end only in instances of the original schema."""

    @pytest.mark.parametrize("name", sorted(cases))
    def test_rewrite_accepts_valid_and_rejects_invalid(tok, name):
        check_labels_and_automaton(tok, name, *cases[name])

    @pytest.mark.parametrize("name", sorted(cases))
    def test_random_walks_end_only_in_instances_of_the_original_schema(tok, name):
        check_random_walks(tok, name, cases[name][0])

    return test_rewrite_accepts_valid_and_rejects_invalid, test_random_walks_end_only_in_instances_of_the_original_schema


test_rewrite_accepts_valid_and_rejects_invalid, test_random_walks_end_only_in_instances_of_the_original_schema = \
    case_tests(CASES)


def check_labels_and_automaton(tok, name, schema, valid, invalid):
    """The labels agree with `jsonschema`; the automaton accepts `valid` and rejects `invalid`."""
    check = validator(schema)
    assert all(check.is_valid(v) for v in valid) and not any(check.is_valid(v) for v in invalid), name
    c = make(tok, schema)
    for v in valid:
        assert c.accepts(serialise(v, schema)), (name, v, prepare(schema))
    for v in invalid:
        assert not c.accepts(serialise(v, schema)), (name, v, prepare(schema))


def check_random_walks(tok, name, schema):
    """Random walks of the automaton end only in instances the original `schema` validates."""
    check = validator(schema)
    c, rnd, done = make(tok, schema), random.Random(name), 0
    for _ in range(12):
        walk, ids = c.fork(), []
        for _ in range(80):
            legal = walk.mask().nonzero().flatten().tolist()
            assert legal, (name, tok.decode(ids))
            if tok.eos_token_id in legal and (rnd.random() < 0.4 or len(legal) == 1):
                break
            token = rnd.choice([t for t in legal if t != tok.eos_token_id])
            assert walk.advance([token]) == 1
            ids.append(token)
        else:
            continue
        text = tok.decode(ids)
        assert check.is_valid(json.loads(text)), (name, text, prepare(schema))
        done += 1
    assert done, f"{name}: no walk ended"


def test_a_key_negated_by_not_required_is_never_generated_and_the_object_stays_closed(tok):
    schema = {**OBJ, "properties": {**OBJ["properties"], "c": {"type": "boolean"}}, "not": {"required": ["a"]}}
    assert prepare(schema)["additionalProperties"] is False  # closed first, then the rewrite joins allOf
    c, rnd = make(tok, schema), random.Random(0)
    for _ in range(30):
        walk, ids = c.fork(), []
        while tok.eos_token_id not in (legal := walk.mask().nonzero().flatten().tolist()) or rnd.random() < 0.5:
            if legal == [tok.eos_token_id] or len(ids) > 60:
                break
            token = rnd.choice([t for t in legal if t != tok.eos_token_id])
            walk.advance([token])
            ids.append(token)
        text = tok.decode(ids)
        if walk.is_final():
            value = json.loads(text)
            assert "a" not in value and set(value) <= {"b", "c"}, text


def test_objects_inside_not_are_not_closed(tok):
    """Closing a negated object would narrow what `not` excludes, so widen the result: it is left as written."""
    schema = {"not": {"type": "object", "properties": {"a": {"type": "string"}}}}
    assert "additionalProperties" not in json.dumps(prepare(schema))
    c = make(tok, schema)
    assert c.accepts('{"a": 1}') and not c.accepts('{"a": "x", "b": 1}') and c.accepts("3")


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_forms_without_an_exact_rewrite_stay_refused_naming_not_and_path(tok, name):
    schema = {"type": "object", "properties": {"p": REFUSED[name]}}
    with pytest.raises(ConstraintError, match=r"'not' at #/properties/p"):
        make(tok, schema)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(words=st.lists(st.text(alphabet="ab\né😀.[", max_size=4), max_size=5),
       probes=st.lists(st.text(alphabet="ab\né😀.[c", max_size=6), max_size=20))
def test_complement_regex_matches_exactly_the_other_strings(words, probes):
    regex = re.compile(_complement(sorted(set(words))))  # the syntax llguidance reads, which Python reads alike
    for s in probes + words:
        assert bool(regex.fullmatch(s)) == (s not in words), (words, s)


def test_a_key_required_only_through_a_dependency_keeps_the_object_open(tok):
    """Closing would forbid `b`, which `a` requires: the object would admit no `a` at all (a Glaive schema did)."""
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "dependentRequired": {"a": ["b"]}}
    assert "additionalProperties" not in prepare(schema)
    c = make(tok, schema)
    assert c.accepts('{"a": 1, "b": 2}') and not c.accepts('{"a": 1}') and c.accepts("{}")


def test_a_negation_that_leaves_nothing_admits_no_value(tok):
    with pytest.raises(ConstraintError, match="admits no value"):
        make(tok, {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"],
                   "not": {"type": "object"}})


def test_schema_walks_enter_properties_whatever_their_names():
    """A property may be called "default", "enum" or "not": its schema is still walked (the walk used to skip it as
    if it were the keyword), so an allOf `$ref` inside it is opened like any other."""
    from specstruct.constraints.schema.logic import dict_nodes

    inner = {"allOf": [{"$ref": "#/definitions/cmd"}, {"required": ["command"]}]}
    schema = {"type": "object", "definitions": {"cmd": {"type": "object", "properties": {"command": {"type": "string"},
                                                                                         "note": {"type": "string"}}}},
              "properties": {"default": inner, "not": {"type": "integer"}}, "default": {"skipped": {"x": 1}}}
    seen = list(dict_nodes(schema, skip=("default", "not", "enum")))
    assert any(n is inner for n in seen) and any(n.get("type") == "integer" for n in seen)
    assert not any("skipped" in n for n in seen)  # the keyword `default` (a value) is still not entered
    prepared = json.dumps(prepare(schema))
    assert "cmd__open" in prepared  # the member inside the property called "default" points at the open twin
