"""Output types and call options given in a wrong but plausible shape get a clear error (or are read as meant),
never a raw TypeError/AttributeError or a silent misreading. Found by probing the Python API."""

from __future__ import annotations

import asyncio
import re

import pytest

import specstruct as ss
from specstruct.testing import tiny_model, tiny_tokenizer


def test_regex_takes_a_compiled_pattern_and_refuses_non_strings():
    assert ss.Regex(re.compile("a+")).pattern == "a+"
    for bad in (b"a+", None, 5):
        with pytest.raises(ss.ConstraintError, match="ss.Regex takes the pattern as a str"):
            ss.Regex(bad)


def test_grammar_refuses_non_strings():
    for bad in (None, b'start: "a"'):
        with pytest.raises(ss.ConstraintError, match="ss.Grammar takes the Lark grammar as a str"):
            ss.Grammar(bad)


def test_choice_refuses_a_bare_string_and_non_string_options():
    with pytest.raises(ss.ConstraintError, match=r"ss.Choice\(\['yes'\]\)"):  # was ("y", "e", "s")
        ss.Choice("yes")
    with pytest.raises(ss.ConstraintError, match="None"):  # was the option "None"
        ss.Choice(["a", None])
    assert ss.Choice(("a", "b")).options == ("a", "b")


@pytest.fixture(scope="module")
def engine():
    tok = tiny_tokenizer()
    return ss.SpecStruct(tiny_model(tok, hidden=16, layers=1), tok, config=ss.SpecConfig(max_new_tokens=8))


def test_config_as_a_dict_of_specconfig_keys(engine):
    assert engine.run("hi", config={"max_new_tokens": 3}).stats.new_tokens <= 3
    with pytest.raises(TypeError, match="SpecConfig or a dict"):
        engine.run("hi", config=5)


def test_arun_takes_cache_salt_like_run(engine):
    assert asyncio.run(engine.arun("hi", cache_salt="tenant-1", max_new_tokens=2)).text is not None


def test_prompt_too_long_says_when_the_output_types_instruction_is_the_bulk(engine):
    with pytest.raises(ss.PromptTooLongError, match="of them are the system message, which quotes the output type"):
        engine.run("hi", ss.Choice([str(i) for i in range(2000)]))


@pytest.mark.parametrize("pattern, refused", [
    (r"[^\x00-\x1f]+", False), (r"[^\x00]{1,5}", False), (r"C:\\0", False), (r"\\x00", False),  # cannot write NUL
    (r"a\x00", True), ("a\x00", True), (r"[\x00-\x1f]", True), (r"\x{0}", True)])
def test_a_regex_is_refused_for_nul_only_when_it_can_write_one(pattern, refused):
    """Found by probing: any spelling of NUL was refused, even in the common 'no control characters' class."""
    from specstruct.constraints.compiler import spells_nul

    assert spells_nul(pattern) is refused


def test_smaller_wrong_inputs_get_errors_that_name_them(engine):
    from typing import List

    with pytest.raises(ss.InvalidPromptError, match="system= takes"):
        engine.run("hi", system=5)
    with pytest.raises(TypeError, match=r"SpecStruct\(model, tokenizer"):
        ss.SpecStruct(engine.tokenizer, engine.model)  # swapped
    with pytest.raises(TypeError, match="accepts\\(\\) takes the output text as a str"):
        engine.constraint({"type": "object"}).accepts({"ok": True})
    with pytest.raises(TypeError, match="list of prompts"):
        engine.generate_many("abc")  # was three prompts: "a", "b", "c"
    with pytest.raises(ss.ConstraintError, match="not JSON serializable"):
        engine.constraint({"type": "string", "default": object()})
    with pytest.raises(ss.ConstraintError, match="NaN or Infinity"):
        engine.constraint({"type": "number", "maximum": float("nan")})
    deep = int
    for _ in range(200):
        deep = List[deep]
    with pytest.raises(ss.ConstraintError):  # was a RecursionError from printing the type
        engine.constraint(deep)


def test_a_temperature_too_small_to_sample_decodes_greedily(engine):
    assert ss.SpecConfig(temperature=1e-39).temperature == 0.0  # logits / 1e-39 overflow: vLLM's 1e-5 rule
    assert engine.run("hi", temperature=1e-39, max_new_tokens=3).text == engine.run("hi", max_new_tokens=3).text


def test_a_schema_dict_pattern_in_ecma_syntax_python_lacks_is_valid(engine):
    """jsonschema's metaschema check compiled `pattern` with Python's re, calling \\p{Lu} invalid."""
    c = engine.constraint({"type": "string", "pattern": "^\\p{Lu}{2}$"})
    assert c.accepts('"AB"') and not c.accepts('"ab"')
    with pytest.raises(ss.ConstraintError, match="unclosed character class"):  # still told when it is wrong
        engine.constraint({"type": "string", "pattern": "[a-"})


def test_an_anchor_inside_a_regex_is_named(engine):
    """'a$|b' used to be refused as 'admits no output (empty or unsatisfiable language)'."""
    with pytest.raises(ss.ConstraintError, match=r"anchor \('\$' at character 1\)"):
        engine.constraint(ss.Regex("a$|b"))
    assert engine.constraint(ss.Regex(r"^\$[0-9]+$")).accepts("$12")  # end anchors and an escaped $ are fine


def test_a_verbose_regex_with_a_trailing_comment_compiles(engine):
    """'(?x)ab # comment' was 'invalid regex': the comment swallowed the wrapper's closing parenthesis."""
    c = engine.constraint(ss.Regex("(?x)ab # two letters, $ is fine in a comment"))
    assert c.accepts("ab") and not c.accepts("ab\n")


@pytest.mark.slow
def test_a_huge_schema_is_refused_by_size_before_any_unbounded_check(engine, monkeypatch):
    """Found by probing: a 10.7 MB schema spent a minute in jsonschema's metaschema check (no time bound) before
    max_schema_bytes refused it; now the size comes first, and schemas over 256 KB skip that check."""
    from specstruct.types import output as output_types

    checked = []
    monkeypatch.setattr(output_types, "_check_schema", lambda cls, schema: checked.append(1))
    huge = {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(300_000)}}
    with pytest.raises(ss.ConstraintError, match="max_schema_bytes"):
        engine.constraint(huge)
    big = {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(20_000)}}  # ~0.6 MB
    with pytest.raises(ss.ConstraintError):  # too large for llguidance here; what matters is the skipped check
        engine.constraint(big)
    assert checked == []
    engine.constraint({"type": "object", "properties": {"a": {"type": "string"}}})
    assert checked == [1]


def test_streamed_partial_objects_never_lose_a_key_and_stay_dicts():
    """Found by probing: at `1.` or `1.5e` a number's key vanished from .partial and came back; the last chunk's
    .partial was the Pydantic instance where every other one is a dict."""
    from pydantic import BaseModel

    from specstruct.testing import scripted_engine

    class Score(BaseModel):
        score: float
        neg: float

    chunks = list(scripted_engine('{"score": 1.5e3, "neg": -2.5}').stream("x", Score))
    seen: set = set()
    for c in chunks:
        keys = set(c.partial or {})
        assert keys >= seen, (c.text, c.partial)
        seen = keys
    assert chunks[-1].partial == {"score": 1500.0, "neg": -2.5} and isinstance(chunks[-1].result.value, Score)


def test_accepts_reads_special_token_text_as_the_text_the_engine_writes(engine):
    """Choice(["<|im_end|>"]) produced "<|im_end|>" (written in characters), yet accepts() said False: it parsed the
    text as the special token, which no constraint allows."""
    assert engine.constraint(ss.Choice(["<|im_end|>", "x"])).accepts("<|im_end|>")
    assert engine.constraint({"type": "string"}).accepts('"<|im_end|>"')


@pytest.mark.parametrize("text, output_type, budget", [
    ("abc", ss.Choice(["a", "abc"]), 1), ("123456789", int, 2), ("2024", ss.Regex("[0-9]+"), 1)])
def test_a_value_cut_by_max_new_tokens_is_never_returned_as_complete(text, output_type, budget):
    """Found by probing: "a" of "abc", 123 of 123456789 came back as values (finish_reason "length"): the
    constraint was final there, but the model was still writing."""
    from specstruct.testing import scripted_engine

    with pytest.raises(ss.IncompleteOutputError):
        scripted_engine(text).run("go", output_type, max_new_tokens=budget)


def test_a_complete_value_on_the_last_token_is_returned_or_retried_not_called_cut():
    from pydantic import BaseModel, field_validator

    from specstruct.testing import scripted_engine

    engine = scripted_engine('{"a": 1}')
    budget = len(engine.tokenizer.encode('{"a": 1}', add_special_tokens=False))
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    assert engine.run("go", schema, max_new_tokens=budget).value == {"a": 1}

    class Never(BaseModel):
        a: int

        @field_validator("a")
        @classmethod
        def no(cls, value):
            raise ValueError("never")

    with pytest.raises(ss.ValidationRetryError):  # was IncompleteOutputError ("raise max_new_tokens")
        engine.run("go", Never, max_new_tokens=budget)


def test_whole_text_anchors_in_any_spelling_and_a_surrogate_in_a_choice_are_named(engine):
    assert engine.constraint(ss.Regex(r"\Aab\z")).accepts("ab")
    with pytest.raises(ss.ConstraintError, match=r"anchor \('\\\\A' at character 1\)"):
        engine.constraint(ss.Regex(r"a\Ab"))
    with pytest.raises(ss.ConstraintError, match="ss.Choice option .* lone surrogate"):
        ss.Choice(["ok", "\ud800"])
