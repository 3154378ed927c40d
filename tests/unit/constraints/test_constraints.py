"""Constraint compiler: masks, EOS at final states only, padding ids, forced text, fork/rollback, errors."""

from __future__ import annotations

import json

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specstruct import settings as specstruct_settings
from specstruct.constraints.compiler import choice_regex, compile_constraint, json_regex
from specstruct.errors import ConstraintError
from specstruct.constraints.base import ConstraintSpec

VOCAB = 408  # tiny_model pads the LM head beyond len(tokenizer) == 400
PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"]}


def make(tok, kind, source, vocab=VOCAB, eos=None, backend=None):
    src = json.dumps(source) if kind in ("json", "choice") and not isinstance(source, str) else source
    return compile_constraint(ConstraintSpec(kind, src), tok, vocab_size=vocab,
                              eos_token_ids=eos or [tok.eos_token_id], json_backend=backend)


def outlines(tok, source, **kw):
    """A JSON constraint through the outlines_core regex backend (json_backend="outlines")."""
    return make(tok, "json", source, backend="outlines", **kw)


def ids(tok, text):
    return tok.encode(text, add_special_tokens=False)


def walk_masks(c, tok, token_ids):
    """(mask, is_final) at every prefix of token_ids, advancing c."""
    out = []
    for t in token_ids:
        out.append((c.mask().clone(), c.is_final()))
        assert c.advance([t]) == 1
    out.append((c.mask().clone(), c.is_final()))
    return out


def test_json_accepts_json_dumps_form_and_rejects_others(tok):
    c = make(tok, "json", PERSON)
    assert c.accepts(json.dumps({"name": "Ada Lovelace", "age": 36}))
    assert c.accepts(json.dumps({"name": "Zoë ☃", "age": -1}, ensure_ascii=False))
    assert not c.accepts('{"name": "Ada"}')                  # missing required key
    assert not c.accepts('{"age": 36, "name": "Ada"}')       # schema order is the canonical order
    assert not c.accepts('{"name": "Ada", "age": 36.5}')     # not an integer
    assert not c.accepts('{"name": "Ada", "age": 36')        # incomplete: not final


def test_eos_only_at_final_states_and_padding_never_legal(tok):
    c = make(tok, "json", PERSON)
    eos = tok.eos_token_id
    specials = [i for i, t in tok.added_tokens_decoder.items() if t.special and i != eos]
    text = json.dumps({"name": "Ada", "age": 36})
    for mask, final in walk_masks(c, tok, ids(tok, text)):
        assert mask.shape == (VOCAB,) and mask.dtype == torch.bool
        assert bool(mask[eos]) == final
        assert not mask[len(tok):].any(), "LM-head padding ids must never be legal"
        assert not mask[specials].any(), "special tokens other than EOS must never be legal"
    assert c.is_final() and c.advance([eos]) == 1
    assert c.mask().nonzero().flatten().tolist() == [eos]  # after EOS only EOS stays legal


def test_all_eos_ids_are_legal_exactly_at_final(tok):
    pad = tok.pad_token_id  # use a second id as an extra EOS, as models with two EOS tokens do
    c = make(tok, "regex", "[0-9]+", eos=[tok.eos_token_id, pad])
    assert not c.mask()[[tok.eos_token_id, pad]].any()
    assert c.advance([pad]) == 0
    c.advance(ids(tok, "42"))
    assert c.mask()[[tok.eos_token_id, pad]].all()
    assert c.advance([pad]) == 1 and c.is_final()


def test_forced_text_spans_json_punctuation_and_keys(tok):
    c = make(tok, "json", PERSON)
    assert c.forced_text() == '{"name": "'
    c.advance(ids(tok, '{"name": "Ada'))
    assert c.forced_text() == ""                      # inside a free string: a choice
    c.advance(ids(tok, '"'))
    assert c.forced_text() == ', "age": '
    c.advance(ids(tok, ', "age": 7}'))
    assert c.is_final() and c.forced_text() == ""


def test_forced_text_stops_before_an_incomplete_character(tok):
    c = make(tok, "regex", "é[ab]")
    assert c.forced_text() == "é"
    c2 = make(tok, "choice", ["é1", "é2"])
    assert c2.forced_text() == "é"


def test_advance_stops_at_first_illegal_token(tok):
    c = make(tok, "regex", "ab[0-9]")
    toks = ids(tok, "a") + ids(tok, "b") + ids(tok, "x") + ids(tok, "1")
    assert c.advance(toks) == 2
    assert c.advance([VOCAB - 1]) == 0  # a padding id is never consumed


def test_rollback_restores_state_and_rejects_overshoot(tok):
    c = make(tok, "json", PERSON)
    before = c.mask().clone()
    n = c.advance(ids(tok, '{"name": "A'))
    c.rollback(n)
    assert torch.equal(c.mask(), before) and c.forced_text() == '{"name": "'
    with pytest.raises(ValueError):
        c.rollback(1)


def test_fork_is_independent(tok):
    c = make(tok, "json", PERSON)
    c.advance(ids(tok, '{"name": '))
    f = c.fork()
    f.advance(ids(tok, '"Bob", "age": 1}'))
    assert f.is_final() and not c.is_final()
    assert c.forced_text() == '"'


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, VOCAB - 1), max_size=12), st.integers(0, 12))
def test_advance_then_rollback_restores_the_mask(tokens, split):
    from specstruct.testing import tiny_tokenizer

    tok = tiny_tokenizer()
    for c in (make(tok, "json", PERSON), make(tok, "grammar", 'start: "x" /[a-z]+/ "!"'), make(tok, "text", None)):
        prefix = ids(tok, '{"name": "')[: split % 4] if c.mode == "json" else []
        c.advance(prefix)
        before, final, forced = c.mask().clone(), c.is_final(), c.forced_text()
        n = c.advance(tokens)
        assert 0 <= n <= len(tokens)
        c.rollback(n)
        assert torch.equal(c.mask(), before) and c.is_final() == final and c.forced_text() == forced


def test_choice_and_regex(tok):
    c = make(tok, "choice", ["yes", "no", "a.b (c)"])
    assert c.accepts("yes") and c.accepts("a.b (c)")
    assert not c.accepts("ye") and not c.accepts("axb (c)") and not c.accepts("yesno")
    r = make(tok, "regex", r"\d{3}-[a-z]+")
    assert r.accepts("123-abc") and not r.accepts("12-abc")
    assert choice_regex(["a b", "c-d"]) == r"(a b|c\-d)"


def test_grammar_constraint(tok):
    g = make(tok, "grammar", 'start: "SELECT " COL " FROM " NAME\nCOL: /[a-z]+/\nNAME: /[a-z]+/')
    assert g.forced_text() == "SELECT "
    assert g.accepts("SELECT name FROM people") and not g.accepts("SELECT name")
    mask = g.mask()
    assert not mask[tok.eos_token_id] and not mask[len(tok):].any()
    g.advance(ids(tok, "SELECT a FROM b"))
    assert g.is_final() and g.mask()[tok.eos_token_id]
    f = g.fork()
    assert f.advance([tok.eos_token_id]) == 1 and g.advance(ids(tok, "c")) == 1


def test_free_text_allows_every_real_token_and_eos(tok):
    c = make(tok, "code", None)
    m = c.mask()
    special = [i for i, t in tok.added_tokens_decoder.items() if t.special]
    assert m[tok.eos_token_id] and not m[len(tok):].any()
    assert int(m.sum()) == len(tok) - len(special) + 1
    assert c.is_final() and c.forced_text() == "" and c.accepts("def f():\n    return 1\n")


@pytest.mark.parametrize("kind, source", [("code", None), ("text", None), ("json", PERSON), ("regex", "[a-z]+")])
def test_gguf_vocabulary_padding_pieces_are_never_legal(kind, source):
    """A tokenizer converted from GGUF (what `specstruct pull` builds) fills the LM head's padding rows with
    "[PAD<id>]" pieces; sampled in free text they printed as "[PAD151814]" (seen at temperature 5)."""
    import copy

    from specstruct.testing import tiny_tokenizer

    tok = copy.deepcopy(tiny_tokenizer())
    first = len(tok)
    tok.add_tokens([f"[PAD{i}]" for i in range(first, first + 4)])
    assert tok.convert_tokens_to_ids("[PAD%d]" % (first + 2)) == first + 2
    c = make(tok, kind, source, vocab=first + 8)
    if kind == "json":  # inside a string value, where any text may follow
        prefix = ids(tok, '{"name": "')
        assert c.advance(prefix) == len(prefix)
    assert not c.mask()[first : first + 4].any()
    assert c.mask()[tok.encode("a", add_special_tokens=False)[0]]


def test_json_regex_is_json_dumps_spacing():
    rx = json_regex({"type": "array", "items": {"type": "integer"}, "maxItems": 3})
    import re

    assert re.fullmatch(rx, json.dumps([1, 2, 3])) and not re.fullmatch(rx, "[1,2]")


@pytest.mark.parametrize("source, needle", [
    ("a(b", "unclosed group"),
    ("[z-a]", "invalid character class range"),
    ("(?=a)b", "look-around"),
])
def test_bad_regex_names_regex_and_position(tok, source, needle):
    with pytest.raises(ConstraintError) as e:
        make(tok, "regex", source)
    assert source in str(e.value) and needle in str(e.value) and "^" in str(e.value)


@pytest.mark.parametrize("schema, keyword, path", [
    ({"type": "object", "properties": {"a": {"not": {"type": "string"}}}}, "not", "#/properties/a"),
    ({"type": "integer", "minimum": 0, "multipleOf": 2}, "minimum", "#"),
    ({"type": "number", "minimum": 0.5}, "minimum", "#"),
    ({"type": "number", "multipleOf": 2}, "multipleOf", "#"),
    ({"type": "array", "items": {"type": "integer"}, "uniqueItems": True}, "uniqueItems", "#"),
    ({"type": "object", "properties": {"a": {"type": "string"}}, "if": {}, "then": {}}, "if", "#"),
    ({"type": "object", "patternProperties": {"^x": {"type": "string"}}}, "patternProperties", "#"),
    ({"allOf": [{"type": "string", "pattern": "^a"}, {"pattern": "b$"}]}, "allOf", "#"),
    ({"$ref": "#/$defs/a", "maxLength": 2, "$defs": {"a": {"type": "string"}}}, "maxLength", "#"),
    ({"type": "string", "pattern": ".*"}, "pattern", "#"),
    ({"type": "object", "properties": {"p": {"type": "string", "pattern": "(?!a)b"}}}, "pattern", "#/properties/p"),
])
def test_unsupported_keyword_names_keyword_and_path(tok, schema, keyword, path):
    with pytest.raises(ConstraintError) as e:
        outlines(tok, schema)
    assert f"unsupported JSON-schema keyword '{keyword}' at {path}:" in str(e.value)


def test_annotations_are_fine_and_anyof_siblings_are_distributed(tok):
    schema = {"title": "T", "description": "d", "$schema": "https://json-schema.org/draft/2020-12/schema",
              "type": "object", "properties": {"a": {"type": "string", "default": "x", "examples": ["y"]}},
              "required": ["a"]}
    assert make(tok, "json", schema).accepts('{"a": "z"}')
    c = make(tok, "json", {"type": "string", "anyOf": [{"format": "date"}, {"maxLength": 2}]})
    assert c.accepts('"2024-01-31"') and c.accepts('"ab"') and not c.accepts('"abc"')


def test_allof_members_merge_when_they_combine_cleanly(tok):
    schema = {"$defs": {"named": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}},
              "allOf": [{"$ref": "#/$defs/named"},
                        {"properties": {"age": {"type": "integer"}, "name": {"maxLength": 5}}, "required": ["age"]}]}
    c = outlines(tok, schema)
    assert c.accepts('{"name": "Ada", "age": 36}')
    assert not c.accepts('{"name": "Ada Lovelace", "age": 36}') and not c.accepts('{"name": "Ada"}')
    closed = {"$defs": {"a": {"type": "object", "properties": {"a": {"type": "string"}}, "additionalProperties": False}},
              "allOf": [{"$ref": "#/$defs/a"}, {"properties": {"b": {"type": "string"}}}]}
    with pytest.raises(ConstraintError, match="'allOf'"):  # b would violate a's additionalProperties
        outlines(tok, closed)


def test_allof_ref_member_stays_open_like_an_inline_member(tok):
    """A definition is closed to its own keys where it is used alone, but an allOf member that refers to it must
    let the other members add keys (Github_easy---o12649; with `type` required the schema admitted no value)."""
    schema = {"$defs": {"address": {"type": "object", "properties": {"street": {"type": "string"}}}},
              "type": "object", "properties": {
                  "billing": {"$ref": "#/$defs/address"},
                  "shipping": {"allOf": [{"$ref": "#/$defs/address"},
                                         {"properties": {"kind": {"enum": ["home", "office"]}}, "required": ["kind"]}]}}}
    c = make(tok, "json", schema)
    assert c.accepts('{"billing": {"street": "Elm"}, "shipping": {"street": "Oak", "kind": "home"}}')
    assert not c.accepts('{"billing": {"street": "Elm"}, "shipping": {"street": "Oak", "kind": "ship"}}')
    assert not c.accepts('{"billing": {"street": "Elm", "kind": "home"}}')  # alone, the definition stays closed
    assert not c.accepts('{"shipping": {"street": "Oak"}}')  # kind is required


def test_object_and_its_anyof_branches_share_their_keys(tok):
    """Closed separately, an object and its branches forbade each other's keys: a parent's `uris` next to a tagged
    union on `grant` could never be written (Github_easy---o10011), nor a key only a oneOf branch declares
    (Github_easy---o75096), and a required one made the schema empty. Each key is still checked by its declarer."""
    schema = {"type": "object", "additionalProperties": False,
              "properties": {"grant": {"type": "string"}, "uris": {"type": "array", "items": {"type": "string"}}},
              "oneOf": [{"properties": {"grant": {"const": "code"}, "mode": {"enum": ["a", "b"]}}, "required": ["grant"]},
                        {"properties": {"grant": {"const": "token"}}, "required": ["grant"]}]}
    c = make(tok, "json", schema)
    assert c.accepts('{"grant": "code", "uris": ["x"]}') and c.accepts('{"grant": "token", "uris": []}')
    assert c.accepts('{"grant": "code", "uris": ["x"], "mode": "a"}')
    assert not c.accepts('{"grant": "code", "uris": [1]}') and not c.accepts('{"grant": "code", "mode": "c"}')
    assert not c.accepts('{"grant": "other"}') and not c.accepts('{"grant": "code", "extra": 1}')
    required = {"type": "object", "properties": {"unit": {"type": "string"}},
                "anyOf": [{"properties": {"uom": {"type": "string"}}, "required": ["uom"]}]}
    assert make(tok, "json", required).accepts('{"unit": "K", "uom": "kelvin"}')


@pytest.mark.parametrize("schema", [
    {"enum": []},
    {"type": "string", "minLength": 5, "maxLength": 2},
    {"type": "object", "properties": {"a": False}, "required": ["a"]},
    {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["b"]},
])
def test_unsatisfiable_schema_raises(tok, schema):
    with pytest.raises(ConstraintError):
        outlines(tok, schema)


def test_bad_grammar_raises_with_llguidance_message(tok):
    with pytest.raises(ConstraintError, match="unknown name"):
        make(tok, "grammar", "start: foo")


def test_compiled_programs_are_cached_and_masks_shared(tok):
    a, b = outlines(tok, PERSON), outlines(tok, PERSON)
    assert a._p is b._p and a.mask() is b.mask()  # same per-state cached tensor


def test_disk_cache_roundtrip(tok, tmp_path, monkeypatch):
    import specstruct.constraints.compiler as C
    import specstruct.constraints.outlines.token_table as T

    monkeypatch.setenv("SPECSTRUCT_CACHE", str(tmp_path))
    specstruct_settings.cache_clear()
    monkeypatch.setattr(C, "_PROGRAMS", C.ByteLRU(lambda: 1 << 30))
    monkeypatch.setattr(T, "_MEMO", T.weakref.WeakKeyDictionary())
    schema = {"type": "object", "properties": {"zz": {"type": "boolean"}}, "required": ["zz"]}
    first = outlines(tok, schema)
    files = list((tmp_path / "constraints").rglob("*.index"))
    assert len(files) == 1 and list((tmp_path / "constraints").rglob("table.bin"))
    monkeypatch.setattr(C, "_PROGRAMS", C.ByteLRU(lambda: 1 << 30))
    monkeypatch.setattr(T, "_MEMO", T.weakref.WeakKeyDictionary())
    second = outlines(tok, schema)  # loaded from disk
    assert second._p is not first._p and second.accepts('{"zz": true}') and not second.accepts('{"zz": 1}')


@pytest.mark.parametrize("kind, source, text", [
    ("regex", r"[0-9]+(\.[0-9]+)?", "3.25"),
    ("regex", "a(bc)?", "abc"),
    ("regex", "a(bc)?", "a"),
    ("choice", ["yes", "yes please"], "yes please"),
    ("choice", ["yes", "yes please"], "yes"),
    ("json", {"type": "number"}, "-1.5e+20"),
    ("json", {"enum": [1, 1.5]}, "1.5"),
])
def test_continuation_after_a_possible_end_is_kept(tok, kind, source, text):
    """outlines_core 0.2.14 drops multi-byte continuations out of states where the regex may end; the
    NUL terminator keeps them (see constraints.py)."""
    c = make(tok, kind, source)
    assert c.accepts(text)


def test_user_regex_cannot_escape_its_group(tok):
    with pytest.raises(ConstraintError, match="unopened group"):
        make(tok, "regex", "a)|(?:b")


def test_mask_cache_is_bounded(tok, monkeypatch):
    import specstruct.constraints.outlines.automaton as A
    import specstruct.constraints.compiler as C

    monkeypatch.setattr(C, "_PROGRAMS", C.ByteLRU(lambda: 1 << 30))
    monkeypatch.setattr(A, "MASK_CACHE_BYTES", 0)  # floor: 8 cached masks per program
    c = make(tok, "regex", "[a-z]{0,30}")
    for t in ids(tok, "abcdefghijklmnopqrstuvwxyz"):
        c.mask()
        assert c.advance([t]) == 1
    assert len(c._p._masks) <= c._p.max_masks == 8
    assert c.mask()[tok.eos_token_id]  # still correct after evictions


@pytest.mark.parametrize("schema, good, bad", [
    ({"type": "integer", "minimum": 0}, ["0", "7", "123456"], ["-1", "-0", "01"]),
    ({"type": "integer", "minimum": -5, "maximum": 12}, ["-5", "0", "12", "9"], ["-6", "13", "120"]),
    ({"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 100}, ["1", "99"], ["0", "100"]),
    ({"type": "integer", "minimum": 0, "exclusiveMinimum": True}, ["1"], ["0"]),  # draft 4 spelling
    ({"type": "number", "minimum": 0, "maximum": 1}, ["0", "0.25", "1", "1.0"], ["-0.5", "1.5", "2"]),
    ({"type": "number", "maximum": -2}, ["-2", "-3.5", "-100"], ["-1.5", "0", "2"]),
])
def test_numeric_bounds_are_guaranteed(tok, schema, good, bad):
    c = make(tok, "json", {"type": "object", "properties": {"x": schema}, "required": ["x"]})
    for v in good:
        assert c.accepts(f'{{"x": {v}}}'), v
    for v in bad:
        assert not c.accepts(f'{{"x": {v}}}'), v


def test_numeric_regex_matches_python_comparisons():
    import random
    import re

    from specstruct.constraints.schema.numeric_regex import integer_regex, number_regex

    rnd = random.Random(0)
    for _ in range(150):
        lo, hi = sorted(rnd.sample(range(-300, 300), 2))
        lo, hi = rnd.choice([lo, None]), rnd.choice([hi, None])
        ri, rn = re.compile(integer_regex(lo, hi)), re.compile(number_regex(lo, hi))
        for v in rnd.sample(range(-400, 400), 30):
            inside = (lo is None or v >= lo) and (hi is None or v <= hi)
            assert bool(ri.fullmatch(json.dumps(v))) == inside
            for x in (v + 0.5, v - 0.25, float(v)):
                inside = (lo is None or x >= lo) and (hi is None or x <= hi)
                assert bool(rn.fullmatch(json.dumps(x))) == inside, (lo, hi, x)


def test_length_bounded_strings_compile_fast_without_escapes(tok):
    import time

    start = time.perf_counter()
    c = outlines(tok, {"type": "string", "minLength": 2, "maxLength": 255})
    assert time.perf_counter() - start < 5  # with escapes inside the count, outlines_core needs minutes
    assert c.accepts('"ab"') and c.accepts('"' + "x" * 255 + '"')
    assert not c.accepts('"a"') and not c.accepts('"' + "x" * 256 + '"')
    assert not c.accepts('"a\\nb"')  # sound subset: no escape sequences in bounded strings


def test_the_constraint_specs_mode_is_its_kind_and_the_old_third_argument_is_deprecated():
    assert ConstraintSpec("regex", "a+").mode == "regex"
    with pytest.warns(DeprecationWarning, match="ConstraintSpec\\(kind, source\\)"):
        assert ConstraintSpec("json", "{}", "json") == ConstraintSpec("json", "{}")
    with pytest.raises(ValueError, match="the mode is the kind"):
        ConstraintSpec("json", "{}", "regex")
