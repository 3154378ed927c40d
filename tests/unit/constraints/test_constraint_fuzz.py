"""Property-based tests of the JSON and regex constraints (hypothesis, hypothesis-jsonschema).

- random schemas from the supported keyword set: instances hypothesis-jsonschema draws are accepted (written
  as the engine writes JSON), mutated ones that `jsonschema` rejects are rejected too, and random walks of
  the automaton end only in outputs `jsonschema` validates;
- random regexes: the automaton accepts exactly the strings Python's `re.fullmatch` accepts.

A short budget runs in CI; the long run is `SPECSTRUCT_FUZZ_EXAMPLES=1000 pytest tests/unit/test_constraint_fuzz.py`
(what it found is recorded in docs/conformance.md).
"""

from __future__ import annotations

import json
import os
import random
import re

import jsonschema

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specstruct.bench.conformance import serialise
from specstruct.constraints.base import ConstraintSpec
from specstruct.constraints.compiler import compile_constraint
from specstruct.constraints.schema.closing import close_objects
from specstruct.errors import ConstraintError

EXAMPLES = int(os.environ.get("SPECSTRUCT_FUZZ_EXAMPLES", "8"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=EXAMPLES <= 8,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                       HealthCheck.filter_too_much, HealthCheck.data_too_large])

_names = st.sampled_from(["a", "b", "id", "name", "x_y", "é"])
_leaf = st.one_of(
    st.just({"type": "boolean"}), st.just({"type": "null"}),
    st.builds(lambda lo, span: {"type": "integer", "minimum": lo, "maximum": lo + span},
              st.integers(-50, 50), st.integers(0, 100)),
    st.builds(lambda lo: {"type": "number", "minimum": lo}, st.integers(-5, 5)),
    st.builds(lambda lo, span: {"type": "string", "minLength": lo, "maxLength": lo + span},
              st.integers(0, 3), st.integers(0, 5)),
    st.builds(lambda vs: {"enum": vs}, st.lists(st.sampled_from(["red", "green", 1, None, True]), min_size=1,
                                               max_size=3, unique=True)),
    st.just({"type": "string", "pattern": "^[a-z]{1,4}$"}),
    st.just({"type": "string", "format": "date"}),
)


def _object(children):
    def build(props, required, closed):
        schema = {"type": "object", "properties": props, "required": sorted(set(required) & set(props))}
        return {**schema, "additionalProperties": False} if closed else schema
    return st.builds(build, st.dictionaries(_names, children, min_size=1, max_size=3), st.lists(_names, max_size=3),
                     st.booleans())


SCHEMAS = st.recursive(_leaf, lambda kids: st.one_of(
    _object(kids),
    st.builds(lambda it, lo, span: {"type": "array", "items": it, "minItems": lo, "maxItems": lo + span},
              kids, st.integers(0, 2), st.integers(0, 3)),
    st.builds(lambda a, b: {"anyOf": [a, b]}, kids, kids),
), max_leaves=6)


def _compile(tok, kind, source):
    return compile_constraint(ConstraintSpec(kind, source), tok, vocab_size=408, eos_token_ids=[2])


def _mutate(value, rnd: random.Random):
    """A nearby value: a changed leaf, a dropped or added key, an extra item."""
    if isinstance(value, dict) and value and rnd.random() < 0.5:
        key = rnd.choice(sorted(value))
        out = dict(value)
        if rnd.random() < 0.5:
            del out[key]
        else:
            out[key] = _mutate(out[key], rnd)
        return out
    if isinstance(value, list) and value:
        return value + [value[0]] if rnd.random() < 0.5 else [_mutate(value[0], rnd)] + value[1:]
    return rnd.choice([None, "zz", -1000, 1.5, True, [], {}])


@FUZZ
@given(schema=SCHEMAS, data=st.data())
def test_random_schemas_accept_their_instances_and_reject_mutants(tok, schema, data):
    from hypothesis_jsonschema import from_schema

    try:
        c = _compile(tok, "json", json.dumps(schema))
    except ConstraintError as e:  # refusing is allowed only for an empty language
        assert "admits no value" in str(e), (schema, e)
        return
    validator = jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker())
    closed = close_objects(schema)  # documented: undeclared keys are generated only where a schema allows them
    value = data.draw(from_schema(closed).filter(lambda v: validator.is_valid(v)), label="instance")
    text = serialise(value, schema)
    if re.search(r"\d[eE][+-]?\d", text) and "minimum" in json.dumps(schema):
        return  # documented narrowing: llguidance writes bounded numbers without an exponent
    if "\x7f" in text:
        return  # documented narrowing: DEL is written escaped (\u007f), json.dumps writes it raw
    assert c.accepts(text), (schema, text)
    rnd = random.Random(len(text))
    for _ in range(5):
        mutant = _mutate(value, rnd)
        if not validator.is_valid(mutant):
            assert not c.accepts(serialise(mutant, schema)), (schema, mutant)


@FUZZ
@given(schema=SCHEMAS, seed=st.integers(0, 2**16))
def test_random_walks_end_only_in_valid_json(tok, schema, seed):
    try:
        c = _compile(tok, "json", json.dumps(schema))
    except ConstraintError:
        return
    validator = jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker())
    rnd = random.Random(seed)
    for _ in range(3):
        walk, ids = c.fork(), []
        for _ in range(120):
            legal = walk.mask().nonzero().flatten().tolist()
            assert legal, (schema, tok.decode(ids))  # a live state always has a way on
            if 2 in legal and (rnd.random() < 0.3 or len(legal) == 1):
                break
            token = rnd.choice([t for t in legal if t != 2])
            assert walk.advance([token]) == 1
            ids.append(token)
        else:
            continue  # still going: no complete output to check
        text = tok.decode(ids)
        assert validator.is_valid(json.loads(text)), (schema, text)


_atom = st.one_of(st.sampled_from(list("abc")), st.just("[ab]"), st.just("[^a]"), st.just("."), st.just("\\d"))
REGEXES = st.recursive(_atom, lambda kids: st.one_of(
    st.builds(lambda a, b: a + b, kids, kids),
    st.builds(lambda a, b: f"({a}|{b})", kids, kids),
    st.builds(lambda a, q: f"({a}){q}", kids, st.sampled_from(["?", "*", "+", "{2}", "{1,3}", "{0,2}"])),
), max_leaves=5)


@FUZZ
@given(regex=REGEXES, strings=st.lists(st.text(alphabet="abc1 ", max_size=6), min_size=5, max_size=10))
def test_random_regexes_match_like_python_re(tok, regex, strings):
    c = _compile(tok, "regex", regex)
    pattern = re.compile(regex, re.DOTALL)
    for s in strings:
        assert c.accepts(s) == bool(pattern.fullmatch(s)), (regex, s)


@pytest.mark.parametrize("regex, text", [("(a|ab)(c|bcd)", "abcd"), ("a{0,2}b?", "aab")])
def test_regex_examples_hypothesis_found_worth_keeping(tok, regex, text):
    assert _compile(tok, "regex", regex).accepts(text) == bool(re.fullmatch(regex, text))
