"""Structure guesses (proposers/guess.py): a number's end, the next key in schema order and another item, each
followed by the text the grammar forces; nothing where the grammar rules the guess out. With the tests' real BPE
tokenizer and llguidance's JSON grammar."""

from __future__ import annotations

import json

import pytest

from specstruct.constraints.base import ConstraintSpec
from specstruct.constraints.compiler import compile_constraint
from specstruct.constraints.llguidance.json_schema import property_names
from specstruct.spec.proposers.guess import StructureGuessDrafter

PERSON = {"type": "object", "required": ["name", "city"],
          "properties": {"name": {"type": "string"}, "age": {"type": "integer"}, "city": {"type": "string"}}}
NOTE = {"type": "object", "required": ["name", "note"],
        "properties": {"name": {"type": "string"}, "note": {"anyOf": [{"type": "string"}, {"type": "null"}]}}}
ORDER = {"type": "object", "required": ["items"], "properties": {"items": {"type": "array", "items": {
    "type": "object", "required": ["q"], "properties": {"q": {"type": "integer"}}}}}}


def _propose(tok, schema, written: str, mode: str = "json", k: int = 16, prompt: str = "Extract: ") -> str:
    """What the drafter proposes after `written` (an output prefix the constraint has accepted)."""
    source = json.dumps(schema) if mode == "json" else None
    constraint = compile_constraint(ConstraintSpec(mode, source), tok, vocab_size=len(tok),
                                    eos_token_ids=[tok.eos_token_id])
    ids = tok.encode(written, add_special_tokens=False)
    assert constraint.advance(ids) == len(ids)
    context = tok.encode(prompt, add_special_tokens=False) + ids
    draft = StructureGuessDrafter(tok).propose(context, constraint, k, 0.0, text=tok.decode(context))
    assert draft.source == "guess" and len(draft.tokens) <= k
    return tok.decode(draft.tokens)


@pytest.mark.parametrize("written, expected", [
    ('{"name": "Erik", "', 'age": '),  # an optional key: the first the schema declares after the last written
    ('{"name": "Erik", "age": 31', ', "city": "'),  # a number's end, then the forced key
    ('{"name": "Erik", "age": 31, "city": "Go', ""),  # inside a string: no structure to guess
    ('{"name": "R2', ""),  # a digit inside a string is not a number's end
    ('{"items": [{"q": 3', '}, {"q": '),  # the last property's number: the object closes, another item follows
    ('{"items": [', '{"q": '),  # a value opens where the grammar takes an object (or the array's end)
    ('{"name": "Erik", "note": ', '"'),  # a string or null: the string
])
def test_guesses(tok, written, expected):
    schema = ORDER if "items" in written else NOTE if "note" in written else PERSON
    assert _propose(tok, schema, written) == expected


@pytest.mark.parametrize("written, expected", [
    ('{"name": "Erik Lindqvist', '", "age": '),  # the source goes on with ", 31": the string ends, the next key
    ('{"name": "Erik", "city": "Gothenburg', '"}'),  # a full stop; no property is left to write
    ('{"name": "Erik Lind', ""),  # inside a word of the source
])
def test_a_string_ends_where_the_copied_clause_does(tok, written, expected):
    prompt = "Extract: Erik Lindqvist, 31, a marine biologist from Gothenburg.\n"
    assert _propose(tok, PERSON, written, prompt=prompt) == expected


def test_no_key_is_guessed_as_a_string_in_an_array(tok):
    tagged = {"type": "object", "required": ["tags"], "properties": {
        "tags": {"type": "array", "items": {"type": "string"}}, "name": {"type": "string"}}}
    assert _propose(tok, tagged, '{"tags": ["a", "') == ""


def test_a_long_forced_text_fills_the_proposal_without_guesses(tok):
    long = {"type": "object", "required": ["a", "b"], "properties": {
        "a": {"type": "integer"}, "b": {"const": "x" * 3000}, "c": {"type": "integer"}}}
    got = _propose(tok, long, '{"a": 3', k=8)
    assert got.startswith(', "b": ') and len(tok.encode(got, add_special_tokens=False)) <= 8


def test_guesses_stay_within_k(tok):
    assert len(tok.encode(_propose(tok, PERSON, '{"name": "Erik", "age": 31', k=2), add_special_tokens=False)) <= 2


def test_nothing_outside_json(tok):
    assert _propose(tok, None, "Total: 31", mode="text") == ""


def test_property_names_in_declared_order_each_once():
    schema = {"properties": {"b": {"type": "object", "properties": {"z": {}, "a": {}}}, "a": {}, "c": {}},
              "$defs": {"d": {"properties": {"c": {}, "y": {}}}},
              "default": {"properties": {"w": 1}}}  # an instance, not a schema
    assert property_names(schema) == ("b", "a", "c", "z", "y")
