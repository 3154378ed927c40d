"""tool_choice="none": the reply is text, even when it looks like a call (found with the real model: a fenced JSON
block, free text under "none", came back as a call, even to an unbound tool)."""

from __future__ import annotations

import operator
from functools import reduce

from langchain_specstruct import ChatSpecStruct
from specstruct.testing import scripted_engine

LIGHT = {"type": "function", "function": {"name": "Light", "parameters": {
    "type": "object", "properties": {"on": {"type": "boolean"}}, "required": ["on"]}}}


def test_tool_choice_none_never_returns_calls_even_for_a_fenced_block():
    fenced = '```json\n{"name": "Light", "arguments": {"on": true}}\n```'
    model = ChatSpecStruct(engine=scripted_engine(fenced, max_new_tokens=60), max_tokens=60)
    bound = model.bind_tools([LIGHT], tool_choice="none")
    for msg in (bound.invoke("Switch on the light."), reduce(operator.add, bound.stream("Switch on the light."))):
        assert msg.tool_calls == [] and "Light" in msg.content
