"""Conversations render through the model's chat template: here Qwen2.5's own template (copied from the
Qwen2.5-Coder tokenizer) over the tiny tokenizer, so tool calls, tool results, system messages and
repeated roles are checked against the real format without the real weights."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from langchain_core.messages import AIMessage, ChatMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.utils.function_calling import convert_to_openai_tool

from langchain_specstruct._messages import content_text, to_chat_messages

TEMPLATE = (Path(__file__).parent / "qwen2_5_chat_template.jinja").read_text()


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@pytest.fixture(scope="module")
def qwen_tok():
    from specstruct.testing import tiny_tokenizer

    tok = tiny_tokenizer()
    original = tok.chat_template
    tok.chat_template = TEMPLATE
    yield tok
    tok.chat_template = original


def render(tok, messages, tools=None) -> str:
    return tok.apply_chat_template(to_chat_messages(messages), tools=tools, add_generation_prompt=True,
                                   tokenize=False)


def test_tool_history_renders_in_qwen_format(qwen_tok):
    history = [
        SystemMessage("You add numbers."),
        HumanMessage("What is 1 + 2 and 3 + 4?"),
        AIMessage("", tool_calls=[{"name": "add", "args": {"a": 1, "b": 2}, "id": "c1", "type": "tool_call"},
                                  {"name": "add", "args": {"a": 3, "b": 4}, "id": "c2", "type": "tool_call"}]),
        ToolMessage("3", tool_call_id="c1", name="add"),
        ToolMessage("7", tool_call_id="c2", name="add"),
    ]
    text = render(qwen_tok, history, tools=[convert_to_openai_tool(add)])
    assert text.startswith("<|im_start|>system\nYou add numbers.\n\n# Tools")
    tools_block = text.split("<tools>\n")[1].split("\n</tools>")[0]
    assert json.loads(tools_block)["function"]["name"] == "add"  # the tool signature is shown to the model
    # arguments are dicts, serialised by the template itself (not a JSON string inside a string)
    assert '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>' in text
    assert '<tool_call>\n{"name": "add", "arguments": {"a": 3, "b": 4}}\n</tool_call>' in text
    # consecutive tool results share one user turn
    assert "<|im_start|>user\n<tool_response>\n3\n</tool_response>\n<tool_response>\n7\n</tool_response><|im_end|>" in text
    assert text.endswith("<|im_start|>assistant\n")


def test_repeated_roles_and_system_messages_pass_through(qwen_tok):
    msgs = [SystemMessage("s1"), SystemMessage("s2"), HumanMessage("h1"), HumanMessage("h2"), AIMessage("a1"),
            AIMessage("a2"), HumanMessage("h3")]
    text = render(qwen_tok, msgs)
    for part in ("<|im_start|>system\ns1", "<|im_start|>system\ns2", "<|im_start|>user\nh1",
                 "<|im_start|>user\nh2", "<|im_start|>assistant\na1", "<|im_start|>assistant\na2"):
        assert part in text


def test_list_content_keeps_text_and_drops_provider_tool_blocks():
    msg = AIMessage([{"type": "text", "text": "some "}, {"type": "tool_use", "id": "x", "name": "add", "input": {}},
                     "text"], tool_calls=[{"name": "add", "args": {"a": 1, "b": 2}, "id": "x", "type": "tool_call"}])
    (out,) = to_chat_messages([msg])
    assert out["content"] == "some text"
    assert out["tool_calls"] == [{"id": "x", "type": "function", "function": {"name": "add", "arguments": {"a": 1, "b": 2}}}]
    assert json.dumps(out)  # plain data only


def test_roles_and_tool_ids():
    out = to_chat_messages([ChatMessage(role="developer", content="d"), ToolMessage("r", tool_call_id="t1", name="f")])
    assert out == [{"role": "system", "content": "d"},  # OpenAI's developer role (specstruct has no such role)
                   {"role": "tool", "content": "r", "tool_call_id": "t1", "name": "f"}]


def test_non_text_content_is_refused_with_advice():
    with pytest.raises(ValueError, match="text only"):
        content_text([{"type": "image_url", "image_url": {"url": "http://x/y.png"}}])

