"""Tool calling for LangChain: specstruct.tools (the grammar from the tools' schemas, `tool_choice`, parsing
Qwen's `<tool_call>` format) with its plain call dicts turned into LangChain `ToolCall`s and
`ToolCallChunk`s. The grammar and parsing logic lives in specstruct.tools, shared with the OpenAI server."""

from __future__ import annotations

import json
from typing import Any

from langchain_core.messages.tool import (InvalidToolCall, ToolCall, ToolCallChunk, invalid_tool_call, tool_call,
                                          tool_call_chunk)

from specstruct import tools as _core
from specstruct.tools import (  # noqa: F401 - re-exported for the chat model and the tests
    CLOSE,
    FENCE_CLOSE,
    FENCE_OPEN,
    OPEN,
    call_schema,
    new_call_id,
    not_prefixed_by,
    select_tools,
    special_markers,
    tool_grammar,
    tool_name,
)


def parse_tool_calls(text: str) -> tuple[str, list[ToolCall]]:
    """Split generated text into (free text, LangChain tool calls); see specstruct.tools.parse_tool_calls."""
    content, calls = _core.parse_tool_calls(text)
    return content, [tool_call(name=c["name"], args=c["arguments"], id=c["id"]) for c in calls]


class ToolCallStreamer(_core.ToolCallStreamer):
    """specstruct's streamer, emitting LangChain `ToolCallChunk`s (name, JSON arguments, id, index)."""

    def make_call(self, name: str, arguments: str, call_id: str, index: int) -> ToolCallChunk:
        return tool_call_chunk(name=name, args=arguments, id=call_id, index=index)

    def _chunk(self, call: dict[str, Any]) -> ToolCallChunk:
        """A LangChain ToolCall (`args`) or a core call (`arguments`) as the next chunk."""
        return self.add_call({"name": call["name"], "arguments": call.get("args", call.get("arguments")) or {}})


CUT = "the reply was cut (max_tokens, or a stop string) before this call was complete; its arguments are as far as " \
      "they were written"


def cut_reply(text: str) -> tuple[str, list[ToolCall], list[InvalidToolCall]] | None:
    """A reply cut by max_tokens inside its tool calls, as ChatOpenAI reports one: (text before the calls, the
    complete calls, the cut call in `invalid_tool_calls` with its arguments as written). None when the cut came
    in free text (no call was open)."""
    streamer = _core.ToolCallStreamer()
    content, done = streamer.feed(text)
    if streamer.mode != "tags":
        return None
    rest, cut = streamer.cut()
    calls = [tool_call(name=c["name"], args=json.loads(c["arguments"]), id=c["id"]) for c in done]
    invalid = [invalid_tool_call(name=c["name"], args=c["arguments"], id=c["id"], error=CUT) for c in cut]
    return content + rest, calls, invalid
