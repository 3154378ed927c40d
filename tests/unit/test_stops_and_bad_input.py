"""Stop strings and bad input at the public API.

A scripted target (specstruct.testing.scripted_engine) writes a known text through the real loop, tokenizer
and constraints, so where a stop string falls is known in advance."""

from __future__ import annotations

import pytest

import specstruct as ss
from specstruct.testing import scripted_engine, tiny_tokenizer


def _streamed(engine, *args, **kw) -> tuple[str, ss.Result]:
    chunks = list(engine.stream(*args, **kw))
    return "".join(c.text for c in chunks), chunks[-1].result


@pytest.mark.parametrize("stop", [["Good"], ["d."], ["bye", "o w"]])
def test_stream_never_hands_out_a_stop_string(stop):
    engine = scripted_engine("Hello world. Goodbye.")
    joined, result = _streamed(engine, "hi", stop=stop)
    assert joined == result.text == engine.run("hi", stop=stop).text
    assert not any(s in joined for s in stop)


def test_result_tokens_end_with_the_token_that_completed_the_stop():
    tok = tiny_tokenizer()
    res = scripted_engine("Hello world. Goodbye.").run("hi", stop=["bye"])
    assert res.finish_reason == "stop" and res.text == "Hello world. Good"
    assert "bye" in tok.decode(res.token_ids) and "bye" not in tok.decode(res.token_ids[:-1])


def test_code_mode_stops_at_the_closing_fence_not_the_opening_one():
    engine = scripted_engine("\n```python\nx = 1\n```\nThat is all.")
    res = engine.run("code please", ss.Code())
    assert res.value == "x = 1"
    joined, streamed = _streamed(engine, "code please", ss.Code())
    assert streamed.value == "x = 1" and joined == streamed.text


@pytest.mark.parametrize("output_type, script, stop", [
    (ss.Regex("[0-9]{4}-[0-9]{2}-[0-9]{2}"), "2024-01-31", ["-"]),
    (ss.Choice(["yes please", "no"]), "yes please", [" "]),
    (ss.Grammar('start: "SELECT " /[a-z]+/ ";"'), "SELECT name;", ["name"]),
    ({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}, '{"a": 12}', ["2"]),
])
def test_a_stop_string_never_returns_a_cut_constrained_value(output_type, script, stop):
    engine = scripted_engine(script)
    with pytest.raises(ss.IncompleteOutputError, match="stop string"):
        engine.run("go", output_type, stop=stop)
    with pytest.raises(ss.IncompleteOutputError, match="stop string"):
        list(engine.stream("go", output_type, stop=stop))


def test_a_stop_string_after_a_complete_constrained_value_is_fine():
    res = scripted_engine("yes please").run("go", ss.Choice(["yes", "yes please"]), stop=[" "])
    assert res.value == "yes"


def test_one_stop_string_is_a_list_of_one():  # as in OpenAI's API and transformers' generate
    engine = scripted_engine("Hello world. Goodbye.")
    assert engine.run("hi", stop="bye").text == engine.run("hi", stop=["bye"]).text == "Hello world. Good"


@pytest.mark.parametrize("pattern", ["^[0-9]+$", "^[0-9]+", "[0-9]+$"])
def test_regex_end_anchors_are_accepted_as_the_whole_match_they_already_are(pattern):
    res = scripted_engine("2024").run("year?", ss.Regex(pattern))
    assert res.value == "2024"


@pytest.fixture(scope="module")
def engine():
    return scripted_engine("ok")


@pytest.mark.parametrize("prompt, words", [
    ("bad \ud800 surrogate", "surrogate"),
    ([], "empty"),
    (None, "None"),
    (b"bytes", "bytes"),
    (["hi"], "dict"),
    ([{"role": "wizard", "content": "x"}], "role"),
    ([{"role": "user"}], "content"),
    ([{"role": "user", "content": 3}], "content"),
])
def test_bad_prompts_raise_a_typed_error_naming_the_problem(engine, prompt, words):
    with pytest.raises(ss.InvalidPromptError, match=words):
        engine.run(prompt)
    with pytest.raises(ss.InvalidPromptError, match=words):
        list(engine.stream(prompt))


@pytest.mark.parametrize("params, words", [
    ({"temperature": float("inf")}, "temperature"),
    ({"temperature": float("nan")}, "temperature"),
    ({"seed": 2**70}, "seed"),
    ({"top_p": 0.0}, "top_p"),
    ({"max_new_tokens": 0}, "max_new_tokens"),
])
def test_bad_parameters_raise_a_typed_error_naming_them(engine, params, words):
    with pytest.raises(ss.InvalidParameterError, match=words):
        engine.run("hi", **params)
    with pytest.raises(ss.InvalidParameterError, match=words):
        list(engine.stream("hi", **params))


def test_typed_errors_are_value_errors_and_specstruct_errors():
    assert issubclass(ss.InvalidPromptError, ss.SpecStructError) and issubclass(ss.InvalidPromptError, ValueError)
    assert issubclass(ss.InvalidParameterError, ss.SpecStructError)


@pytest.mark.parametrize("sampling", [{}, {"temperature": 0.8, "seed": 0}])
def test_a_grammar_that_dead_ends_raises_constraint_error_not_a_silent_stop(sampling):
    """Found by probing: a rule with no base case made llguidance stop with an error, which the mask read as
    'stopped' (EOS legal): greedy returned 'b' with finish_reason 'stop', sampling a raw torch error."""
    from specstruct.testing import tiny_model

    tok = tiny_tokenizer()
    engine = ss.SpecStruct(tiny_model(tok, hidden=16, layers=1), tok, config=ss.SpecConfig(max_new_tokens=30))
    with pytest.raises(ss.ConstraintError):
        engine.run("hi", ss.Grammar('start: "b" x\nx: "a" x'), **sampling)
