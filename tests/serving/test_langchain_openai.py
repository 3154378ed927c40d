"""LangChain's own ChatOpenAI against the server: invoke, stream, with_structured_output (every method),
bind_tools and a small agent loop, on the tiny engine."""

from __future__ import annotations

import json
from typing import Literal

import jsonschema
import openai
import pytest
from pydantic import BaseModel
from server_fixtures import KEY, MODEL, running, tiny_engine

from specstruct.serving.openai import create_app

langchain_openai = pytest.importorskip("langchain_openai")
from langchain_core.messages import HumanMessage, ToolMessage  # noqa: E402
from langchain_core.tools import tool  # noqa: E402

LIGHT = {"title": "Light", "type": "object", "required": ["on", "room"], "additionalProperties": False,
         "properties": {"on": {"type": "boolean"}, "room": {"enum": ["kitchen", "hall"]}}}


class Light(BaseModel):
    """Switch a light."""

    on: bool
    room: Literal["kitchen", "hall"]


@tool
def set_mood(happy: bool) -> str:
    """Set the mood."""
    return "mood set"


@pytest.fixture(scope="module")
def llm():
    with running(create_app(tiny_engine(), served_model_name=MODEL, api_key=KEY)) as base:
        yield langchain_openai.ChatOpenAI(base_url=base, api_key=KEY, model=MODEL, max_tokens=120, max_retries=0)


def test_invoke_and_stream(llm):
    short = llm.bind(max_tokens=6)
    msg = short.invoke("hello")
    assert msg.usage_metadata["output_tokens"] == 6 and msg.response_metadata["finish_reason"] == "length"
    chunks = list(short.stream("hello"))
    assert "".join(c.content for c in chunks) == msg.content


@pytest.mark.parametrize("method", ["json_schema", "function_calling"])
def test_structured_output_with_pydantic(llm, method):
    assert isinstance(llm.with_structured_output(Light, method=method).invoke("kitchen light on"), Light)


def test_structured_output_json_mode(llm):
    out = llm.with_structured_output(LIGHT, method="json_schema").invoke("kitchen light on")
    jsonschema.validate(out, LIGHT)
    short = llm.model_copy(update={"max_tokens": 30})
    try:  # json_object leaves the keys free: a random-weight model may not close the object in 30 tokens
        out = short.with_structured_output(None, method="json_mode").invoke("Answer in JSON.")
    except openai.LengthFinishReasonError as cut:
        assert cut.completion.choices[0].message.content.startswith("{")
    else:
        assert isinstance(out, dict)


def test_bind_tools_and_agent_loop(llm):
    agent = llm.bind_tools([set_mood, Light], tool_choice="required")
    history = [HumanMessage("Cheer me up, then switch the light.")]
    reply = agent.invoke(history)
    assert reply.tool_calls and reply.response_metadata["finish_reason"] == "tool_calls"
    for call in reply.tool_calls:
        assert call["name"] in ("set_mood", "Light") and call["id"]
    history.append(reply)
    history += [ToolMessage(json.dumps({"ok": True}), tool_call_id=c["id"]) for c in reply.tool_calls]
    final = llm.bind_tools([set_mood, Light], tool_choice="none").bind(max_tokens=8).invoke(history)
    assert not final.tool_calls and final.content
    streamed = None
    for chunk in agent.stream(history[:1]):
        streamed = chunk if streamed is None else streamed + chunk
    assert streamed.tool_calls and all(c["name"] in ("set_mood", "Light") for c in streamed.tool_calls)
