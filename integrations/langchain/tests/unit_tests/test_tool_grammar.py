"""The tool-call grammar, checked directly with llguidance over the tiny BPE tokenizer, and the parsers."""

from __future__ import annotations

import json

import llguidance
import llguidance.hf
import pytest
from langchain_core.utils.function_calling import convert_to_openai_tool
from pydantic import BaseModel, Field

from langchain_specstruct._tools import (
    ToolCallStreamer,
    not_prefixed_by,
    parse_tool_calls,
    select_tools,
    tool_grammar,
)
from lc_tiny_engine import marker_tokenizer
from specstruct.testing import tiny_tokenizer


class GetWeather(BaseModel):
    """Weather in a city."""

    city: str
    unit: str = Field("celsius", json_schema_extra={"enum": ["celsius", "fahrenheit"]})


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


TOOLS = [convert_to_openai_tool(GetWeather), convert_to_openai_tool(add)]


def call(name: str, args: dict) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': args})}\n</tool_call>"


@pytest.fixture(scope="module")
def lltok():
    return llguidance.hf.from_tokenizer(tiny_tokenizer())


def accepts(lltok, grammar: str, text: str) -> bool:
    """Whether `text`, tokenized as the engine would, is a complete sentence of `grammar`."""
    matcher = llguidance.LLMatcher(lltok, llguidance.LLMatcher.grammar_from_lark(grammar))
    assert not matcher.is_error(), matcher.get_error()
    ids = tiny_tokenizer().encode(text, add_special_tokens=False)
    return matcher.try_consume_tokens(ids) == len(ids) and matcher.is_accepting()


AUTO_CASES = [
    ("Plain answer, no tools needed.", True),
    ("<b>bold</b> text may start with '<'", True),
    (call("add", {"a": 1, "b": 2}), True),
    (call("add", {"a": 1, "b": 2}) + "\n", True),  # Qwen's newline before EOS
    (call("add", {"a": 1, "b": 2}) + "\n\n", False),
    (call("add", {"a": 1, "b": 2}) + "\n" + call("GetWeather", {"city": "Paris", "unit": "celsius"}), True),
    (call("add", {"a": "one", "b": 2}), False),  # argument of the wrong type
    (call("add", {"a": 1}), False),  # missing required argument
    (call("add", {"a": 1, "b": 2, "c": 3}), False),  # invented argument
    (call("sub", {"a": 1, "b": 2}), False),  # unknown tool
    (call("GetWeather", {"city": "Oslo", "unit": "kelvin"}), False),  # outside the enum
    ("<tool_call>\nnot json\n</tool_call>", False),
    ("```json\n" + json.dumps({"name": "add", "arguments": {"a": 1, "b": 2}}) + "\n```", True),  # fenced call
    ("```json\n" + json.dumps({"name": "add", "arguments": {"a": 1}}) + "\n```", False),
    ("```json\n[1, 2]\n```", False),  # a fenced JSON reply must be a valid call
    ("```python\nprint(1)\n```", True),  # other fences are text
]


@pytest.mark.parametrize("text,ok", AUTO_CASES)
def test_auto_allows_text_or_valid_calls(lltok, text, ok):
    assert accepts(lltok, tool_grammar(TOOLS, "auto"), text) is ok


@pytest.mark.parametrize("choice", ["any", "required", True])
def test_required_forbids_text(lltok, choice):
    g = tool_grammar(TOOLS, choice)
    assert not accepts(lltok, g, "Just text.")
    assert accepts(lltok, g, call("add", {"a": 1, "b": 2}))


def test_named_tool_only_allows_that_tool(lltok):
    for choice in ("add", {"type": "function", "function": {"name": "add"}}):
        g = tool_grammar(TOOLS, choice)
        assert accepts(lltok, g, call("add", {"a": 5, "b": 6}))
        assert not accepts(lltok, g, call("GetWeather", {"city": "Paris", "unit": "celsius"}))
        assert not accepts(lltok, g, "text")


def test_none_allows_text_only(lltok):
    g = tool_grammar(TOOLS, "none")
    assert accepts(lltok, g, "Sure, here is an answer.")
    assert not accepts(lltok, g, call("add", {"a": 1, "b": 2}))


def test_parallel_false_allows_one_call(lltok):
    g = tool_grammar(TOOLS, "any", parallel=False)
    one = call("add", {"a": 1, "b": 2})
    assert accepts(lltok, g, one) and accepts(lltok, g, one + "\n")
    assert not accepts(lltok, g, one + "\n" + one)


def test_unknown_tool_choice_names_the_bound_tools():
    with pytest.raises(ValueError, match="GetWeather"):
        select_tools(TOOLS, "multiply")


def test_not_prefixed_by_regex_semantics():
    import re

    def rx(*prefixes):
        return re.compile(not_prefixed_by(*prefixes).replace("(.|\\n)", "(?:.|\\n)"), re.DOTALL)

    one = rx("<tool_call>")
    for text, ok in [("hello", True), ("<", True), ("<tool", True), ("<tool_call", True), ("<toolbox>", True),
                     ("<tool_call>", False), ("<tool_call>{}", False), ("", False)]:
        assert bool(one.fullmatch(text)) is ok, text
    two = rx("<tool_call>", "```json\n")
    for text, ok in [("```python\n", True), ("``", True), ("```json", True), ("```json\n{", False),
                     ("<tool_call>", False), ("plain", True)]:
        assert bool(two.fullmatch(text)) is ok, text


def test_parse_fenced_call_only_when_it_is_the_whole_reply():
    body = json.dumps({"name": "add", "arguments": {"a": 1, "b": 2}})
    content, calls = parse_tool_calls(f"```json\n{body}\n```\n")
    assert content == "" and [(c["name"], c["args"]) for c in calls] == [("add", {"a": 1, "b": 2})]
    text = f"Here is data:\n```json\n{body}\n```"
    assert parse_tool_calls(text) == (text, [])


def test_parse_tool_calls_gives_unique_ids_and_dict_args():
    text = call("add", {"a": 1, "b": 2}) + "\n" + call("add", {"a": 3, "b": 4})
    content, calls = parse_tool_calls(text)
    assert content == ""
    assert [c["args"] for c in calls] == [{"a": 1, "b": 2}, {"a": 3, "b": 4}]
    assert all(c["type"] == "tool_call" and c["name"] == "add" for c in calls)
    assert len({c["id"] for c in calls}) == 2
    assert parse_tool_calls("no calls here") == ("no calls here", [])


def test_streamer_emits_one_chunk_per_completed_call():
    text = call("add", {"a": 1, "b": 2}) + "\n" + call("GetWeather", {"city": "Rome", "unit": "celsius"})
    streamer, chunks = ToolCallStreamer(), []
    for i in range(0, len(text), 7):  # arbitrary chunk boundaries
        delta, calls = streamer.feed(text[i:i + 7])
        assert delta == ""
        chunks += calls
    assert [c["name"] for c in chunks] == ["add", "GetWeather"]
    assert [c["index"] for c in chunks] == [0, 1]
    assert json.loads(chunks[1]["args"]) == {"city": "Rome", "unit": "celsius"}
    assert streamer.finish() == ("", [])


def test_streamer_reports_a_fenced_call_at_the_end():
    streamer = ToolCallStreamer()
    text = "```json\n" + json.dumps({"name": "add", "arguments": {"a": 1, "b": 2}}) + "\n```"
    assert all(streamer.feed(text[i:i + 5]) == ("", []) for i in range(0, len(text), 5))
    tail, (chunk,) = streamer.finish()
    assert tail == "" and chunk["name"] == "add" and json.loads(chunk["args"]) == {"a": 1, "b": 2}


def test_streamer_passes_text_through_once_it_cannot_be_a_call():
    streamer = ToolCallStreamer()
    assert streamer.feed("<to") == ("", [])  # might still become <tool_call>
    assert streamer.feed("day") == ("<today", [])
    assert streamer.feed(" is fine") == (" is fine", [])
    assert streamer.finish() == ("", [])


def test_added_marker_tokens_are_named_as_tokens_in_the_grammar():
    """llguidance treats every added token as special, so with Qwen-style `<tool_call>` tokens the grammar must
    reference the token (a string literal would reject it); free text still may not open a call."""
    tok = marker_tokenizer()
    lltok = llguidance.hf.from_tokenizer(tok)
    g = tool_grammar(TOOLS, "auto", tok)
    assert "call: <tool_call> " in g
    for text, ok in [(call("add", {"a": 1, "b": 2}), True), ("free text", True), ("<tool_call>", False)]:
        ids = tok.encode(text, add_special_tokens=False)
        matcher = llguidance.LLMatcher(lltok, llguidance.LLMatcher.grammar_from_lark(g))
        assert (matcher.try_consume_tokens(ids) == len(ids) and matcher.is_accepting()) is ok, text
    assert tok.encode("<tool_call>", add_special_tokens=False) == [tok.convert_tokens_to_ids("<tool_call>")]


class Address(BaseModel):
    city: str
    previous: "Address | None" = None


class Move(BaseModel):
    """Move a person to a new address."""

    person: str
    to: Address


def test_parameters_with_defs_and_refs_compile_and_constrain(lltok):
    """Pydantic puts nested models under `$defs` and points at them with `$ref` (openai.pydantic_function_tool and
    MCP tool schemas keep them): nested inside the call schema those pointers named the wrong root and the grammar
    did not compile."""
    move = {"type": "function", "function": {"name": "Move", "parameters": Move.model_json_schema()}}
    assert "$defs" in move["function"]["parameters"]
    g = tool_grammar([move, *TOOLS], "required")
    assert accepts(lltok, g, call("Move", {"person": "Ada", "to": {"city": "Oslo", "previous": {"city": "Rome"}}}))
    assert accepts(lltok, g, call("add", {"a": 1, "b": 2}))
    assert not accepts(lltok, g, call("Move", {"person": "Ada", "to": {"town": "Oslo"}}))
    assert not accepts(lltok, g, call("Move", {"person": "Ada", "to": {"city": 3}}))


def test_parameters_no_grammar_can_guarantee_fail_at_bind_time_naming_the_tool():
    from specstruct.errors import ConstraintError

    def tool(parameters):
        return {"type": "function", "function": {"name": "lookup", "parameters": parameters}}

    with pytest.raises(ConstraintError, match="'lookup'.*type \"object\""):
        tool_grammar([tool({"type": "string"})], "required")
    with pytest.raises(ConstraintError, match="'lookup'.*wat"):
        tool_grammar([tool({"type": "object", "properties": {"q": {"type": "wat"}}})], "auto")
    # what response_format accepts, tools accept: `not` is rewritten into an exact positive equivalent
    tool_grammar([tool({"type": "object", "properties": {"q": {"type": "integer", "not": {"enum": [0]}}}})], "auto")


def test_arguments_keep_the_declared_property_order(lltok):
    """Arguments are written in the order the schema declares them (as Qwen's template does); the preparation must
    not reorder the properties (a sorted cache key once did, and BFCL's valid calls were rejected)."""
    tool = {"type": "function", "function": {"name": "book", "parameters": {
        "type": "object", "properties": {"zeta": {"type": "integer"}, "alpha": {"type": "integer"}},
        "required": ["zeta", "alpha"]}}}
    g = tool_grammar([tool], "required")
    assert accepts(lltok, g, "<tool_call>\n" + '{"name": "book", "arguments": {"zeta": 1, "alpha": 2}}' + "\n</tool_call>")


def test_parameters_from_real_schemas_keep_their_refs_ids_and_open_objects(lltok):
    """Shapes met in the corpus's schemas used as tool parameters: a `$ref` inside a property called "default", a
    draft-04 `id` beside local refs, an open object constrained only by `not`, and a tool with no arguments."""
    def tool(name, parameters):
        return {"type": "function", "function": {"name": name, "parameters": parameters}}

    cmd = {"type": "object", "properties": {"command": {"type": "string"}}, "additionalProperties": False}
    tools = [
        tool("run", {"type": "object", "definitions": {"cmd": cmd},
                     "properties": {"default": {"allOf": [{"$ref": "#/definitions/cmd"}, {"required": ["command"]}]},
                                    "steps": {"type": "array", "items": {"$ref": "#/definitions/cmd"}}}}),
        tool("azure", {"id": "https://schema.example.com/x.json#", "type": "object", "definitions": {"n": {"type": "integer"}},
                       "properties": {"count": {"$ref": "#/definitions/n"}}, "required": ["count"]}),
        tool("annotate", {"type": "object", "not": {"required": ["body", "bodyValue"]}}),
        tool("ping", {"type": "object", "description": "no arguments"}),
    ]
    g = tool_grammar(tools, "required")
    assert accepts(lltok, g, call("run", {"default": {"command": "ls"}, "steps": [{"command": "pwd"}]}))
    assert not accepts(lltok, g, call("run", {"default": {}}))  # "command" is required there
    assert accepts(lltok, g, call("azure", {"count": 3})) and not accepts(lltok, g, call("azure", {"count": "3"}))
    assert accepts(lltok, g, call("annotate", {"body": "x"}))  # open: keys allowed ...
    assert not accepts(lltok, g, call("annotate", {"body": "x", "bodyValue": "y"}))  # ... but never both
    assert accepts(lltok, g, call("ping", {})) and not accepts(lltok, g, call("ping", {"x": 1}))


def test_a_cut_call_keeps_its_name_and_the_arguments_written_so_far():
    from specstruct.constraints.tools.grammar import ToolCallStreamer

    for text, expected in [('<tool_call>\n{"name": "add", "arguments": {"a": 1', ("add", '{"a": 1')),
                           ('<tool_call>\n{"name": "add", "argu', ("add", "")),
                           ('<tool_call>\n{"name": "ad', None)]:  # no whole name: nothing to report
        streamer = ToolCallStreamer()
        assert streamer.feed(text) == ("", [])
        _, calls = streamer.cut()
        assert [(c["name"], c["arguments"]) for c in calls] == ([expected] if expected else []), text


def test_free_text_never_holds_a_call_marker(lltok):
    """Found by probing: text first, then a `<tool_call>` block, passed the grammar (the text branch only checked
    how the reply starts) and was parsed into an unchecked call: an unbound tool, wrong arguments, or a call under
    tool_choice "none"."""
    for choice in ("auto", "none"):
        g = tool_grammar(TOOLS, choice)
        assert not accepts(lltok, g, "Let me check.\n" + call("launch_rocket", {"target": "moon"}))
        assert not accepts(lltok, g, "a <tool_call> b")
        assert accepts(lltok, g, "a <tool_ b")


def test_with_the_marker_as_a_special_token_text_may_come_before_checked_calls():
    tok = marker_tokenizer()
    lltok = llguidance.hf.from_tokenizer(tok)
    g = tool_grammar(TOOLS, "auto", tok)

    def ok(text):
        ids = tok.encode(text, add_special_tokens=False)
        matcher = llguidance.LLMatcher(lltok, llguidance.LLMatcher.grammar_from_lark(g))
        return matcher.try_consume_tokens(ids) == len(ids) and matcher.is_accepting()

    assert ok("Let me check.\n" + call("add", {"a": 1, "b": 2}))
    assert not ok("Let me check.\n" + call("add", {"a": "x", "b": 2}))  # the call is still checked
    assert not ok("Let me check.\n" + call("sub", {"a": 1, "b": 2}))


def test_streamed_text_then_a_call_gives_what_invoke_gives():
    from specstruct.constraints.tools.grammar import ToolCallStreamer, parse_tool_calls

    text = 'Let me check.\n<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
    streamer, out, calls = ToolCallStreamer(), [], []
    for i in range(0, len(text), 3):
        o, c = streamer.feed(text[i:i + 3])
        out.append(o)
        calls += c
    o, c = streamer.finish()
    content, parsed = parse_tool_calls(text)
    assert "".join(out) + o == content == "Let me check."
    assert [(c["name"], json.loads(c["arguments"])) for c in calls] == [(p["name"], p["arguments"]) for p in parsed]
