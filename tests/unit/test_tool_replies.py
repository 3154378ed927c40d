"""Tool calls on the Python API: `tools=` without an output type constrains the reply like the server does and
returns a ToolReply; before, the tools only reached the chat template and a call came back as unchecked text."""

import asyncio
import json

import pytest

import specstruct as ss
from specstruct.testing import scripted_engine
from specstruct.api.tool_replies import reply_spec

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
MOOD = {"type": "function", "function": {"name": "set_mood", "parameters": {
    "type": "object", "properties": {"level": {"type": "integer"}}, "required": ["level"]}}}
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


def test_a_call_comes_back_parsed_and_checked():
    engine = scripted_engine(CALL, max_new_tokens=60)
    reply = engine.generate("Weather in Paris?", tools=[WEATHER, MOOD])
    assert isinstance(reply, ss.ToolReply)
    assert [(c["name"], c["arguments"]) for c in reply.tool_calls] == [("get_weather", {"city": "Paris"})]
    assert reply.content == "" and reply.tool_calls[0]["id"].startswith("call_")


def test_a_call_to_an_unbound_tool_or_with_wrong_arguments_is_outside_the_constraint():
    engine = scripted_engine(CALL, max_new_tokens=60)
    constraint = engine._compile(reply_spec(engine.tokenizer, None, [WEATHER, MOOD], "auto"))
    assert constraint.accepts(CALL) and constraint.accepts("It is sunny.")
    assert not constraint.accepts('<tool_call>\n{"name": "delete_everything", "arguments": {}}\n</tool_call>')
    assert not constraint.accepts('<tool_call>\n{"name": "set_mood", "arguments": {"level": "high"}}\n</tool_call>')
    assert not constraint.accepts("Let me check.\n" + CALL)  # text then a call spelled out: an unchecked call


def test_text_replies_and_tool_choice_none():
    engine = scripted_engine("It is sunny.", max_new_tokens=20)
    assert engine.generate("hi", tools=[WEATHER]) == ss.ToolReply("It is sunny.", [])
    reply = scripted_engine(CALL, max_new_tokens=60).generate("hi", tools=[WEATHER], tool_choice="none")
    assert reply.tool_calls == [] and "<tool_call>" not in reply.content


def test_stream_and_async_give_the_same_reply():
    engine = scripted_engine(CALL, max_new_tokens=60)
    last = list(engine.stream("hi", tools=[WEATHER]))[-1].result.value
    done = asyncio.run(engine.agenerate("hi", tools=[WEATHER], tool_choice="get_weather"))
    for reply in (last, done):
        assert [(c["name"], c["arguments"]) for c in reply.tool_calls] == [("get_weather", {"city": "Paris"})]


def test_an_output_type_decides_the_reply_and_bad_tool_choices_say_why():
    engine = scripted_engine('{"city": "Paris"}', max_new_tokens=30)
    schema = WEATHER["function"]["parameters"]
    assert engine.generate("hi", schema, tools=[WEATHER]) == {"city": "Paris"}  # tools only render the history
    with pytest.raises(ss.InvalidParameterError, match="exclude each other"):
        engine.run("hi", schema, tools=[WEATHER], tool_choice="required")
    with pytest.raises(ss.InvalidParameterError, match="needs tools"):
        engine.run("hi", tool_choice="required")
    with pytest.raises(ValueError, match="names no bound tool"):
        engine.run("hi", tools=[WEATHER], tool_choice="nope")
    assert json.loads(json.dumps(engine.generate("hi", tools=[WEATHER]).tool_calls)) is not None


def test_markers_as_added_tokens_still_parse():
    """Qwen2.5's `<tool_call>` is one added token; the reply is parsed from the ids, markers kept."""
    import copy

    from specstruct.testing import tiny_tokenizer

    tok = copy.deepcopy(tiny_tokenizer())
    tok.add_tokens(["<tool_call>", "</tool_call>"], special_tokens=True)  # hidden by skip_special_tokens
    reply = scripted_engine(CALL, tokenizer=tok, max_new_tokens=60).generate("hi", tools=[WEATHER])
    assert [(c["name"], c["arguments"]) for c in reply.tool_calls] == [("get_weather", {"city": "Paris"})]


@pytest.mark.parametrize("tools, match", [
    ("ping", "list of tool dicts"), (WEATHER, "list of tool dicts"), (["ping"], r"tools\[0\] is not a function tool"),
    ([{"type": "function"}], r"tools\[0\]"), ([{"type": "function", "function": {"name": 5}}], r"tools\[0\]"),
    ([WEATHER, {**WEATHER, "function": {**WEATHER["function"], "parameters": {"type": "object"}}}], "twice")])
def test_malformed_tools_are_named(tools, match):
    engine = scripted_engine("hi", max_new_tokens=5)
    with pytest.raises(ss.InvalidParameterError, match=match):
        engine.run("hi", tools=tools)
    with pytest.raises(ss.InvalidParameterError, match="names no bound tool"):
        engine.run("hi", tools=[WEATHER], tool_choice="nope")


def test_tool_choice_none_never_returns_calls_and_only_the_grammars_fence_is_a_call():
    """Found with the real model: under "none" a fenced JSON block (free text there) came back as a call, even to
    an unbound tool; a looser fence than the grammar's (leading space, no newlines) parsed as an unchecked call."""
    from specstruct.constraints.tools.grammar import parse_tool_calls

    fenced = '```json\n{"name": "delete_all", "arguments": {"force": true}}\n```'
    reply = scripted_engine(fenced, max_new_tokens=60).generate("hi", tools=[WEATHER], tool_choice="none")
    assert reply.tool_calls == [] and "delete_all" in reply.content
    assert parse_tool_calls(fenced)[1]  # the grammar's own fenced branch is a call
    for loose in (" " + fenced, '```json {"name": "get_weather", "arguments": {"town": 7}}```'):
        assert parse_tool_calls(loose) == (loose, [])  # free text the grammar never checked as a call


def test_history_arguments_as_json_text_render_like_dicts():
    """OpenAI history carries arguments as JSON text; the template's tojson would write an escaped string."""
    engine = scripted_engine("ok", max_new_tokens=5)
    call = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    as_dict = {**call, "function": {**call["function"], "arguments": {"city": "Paris"}}}
    history = [{"role": "user", "content": "weather?"}, {"role": "assistant", "content": "", "tool_calls": [call]},
               {"role": "tool", "tool_call_id": "c1", "content": "18C"}]
    with_dict = [history[0], {**history[1], "tool_calls": [as_dict]}, history[2]]
    assert engine.messages(history) == engine.messages(with_dict)
    bad = [history[0], {**history[1], "tool_calls": [{**call, "function": {"name": "f", "arguments": "{"}}]}]
    with pytest.raises(ss.InvalidPromptError, match=r"tool_calls\[0\].function.arguments is not valid JSON"):
        engine.run(bad)
    bad = [history[0], {**history[1], "tool_calls": [{**call, "function": {"name": "f", "arguments": "[1]"}}]}]
    with pytest.raises(ss.InvalidPromptError, match="must encode a JSON object"):
        engine.run(bad)
