"""Tool calling for LangChain: specstruct.constraints.tools.grammar (the grammar from the tools' schemas, `tool_choice`, parsing
Qwen's `<tool_call>` format) with its plain call dicts turned into LangChain `ToolCall`s and
`ToolCallChunk`s. The grammar and parsing logic lives in specstruct.constraints.tools.grammar, shared with the OpenAI server."""

from __future__ import annotations

import json
import re
from typing import Any

from langchain_core.messages.tool import (InvalidToolCall, ToolCall, ToolCallChunk, invalid_tool_call, tool_call,
                                          tool_call_chunk)

from specstruct.constraints.tools import grammar as _core
from specstruct.constraints.tools.grammar import (FENCE_OPEN, OPEN, call_schema, new_call_id, not_prefixed_by,
                                                  reply_text, select_tools, tool_grammar)

# the core's grammar helpers pass through here to the chat model (one import place for the package)
__all__ = ["ToolCallStreamer", "call_schema", "cut_reply", "not_prefixed_by", "parse_tool_calls", "partial_call",
           "reply_text", "select_tools", "tool_grammar"]


def parse_tool_calls(text: str) -> tuple[str, list[ToolCall]]:
    """Split generated text into (free text, LangChain tool calls); see specstruct.constraints.tools.grammar.parse_tool_calls."""
    content, calls = _core.parse_tool_calls(text)
    return content, [tool_call(name=c["name"], args=c["arguments"], id=c["id"]) for c in calls]


class ToolCallStreamer(_core.ToolCallStreamer):
    """specstruct's streamer, emitting LangChain `ToolCallChunk`s (name, JSON arguments, id, index)."""

    def make_call(self, name: str, arguments: str, call_id: str, index: int) -> ToolCallChunk:
        return tool_call_chunk(name=name, args=arguments, id=call_id, index=index)

    def _chunk(self, call: dict[str, Any]) -> ToolCallChunk:
        """A LangChain ToolCall (`args`) or a core call (`arguments`) as the next chunk."""
        return self.add_call({"name": call["name"], "arguments": call.get("args", call.get("arguments")) or {}})

    def cut_short(self) -> tuple[str, list[ToolCallChunk], list[ToolCallChunk]]:
        """The reply was cut (max_tokens, a stop string): (text still held back, calls complete at the end, the
        call that was cut, as far as written). A call counts as started from the first character of its opener
        (`<tool_call>`, or ```` ```json ```` where "auto" allows a fenced call): held back while streaming, it
        is never content; cut before its name is complete, it has the name as far as written (None: none yet)."""
        buffer, self.buffer = self.buffer, ""
        head = buffer.lstrip()
        if self.mode == "text" or not head:
            return ("" if self.mode == "tags" else buffer), [], []
        if self.mode == "fenced":
            _, calls = _core.parse_tool_calls(buffer)
            if calls:  # complete, only its optional closing newline was cut
                return "", [self.add_call(c) for c in calls], []
        fenced = self.mode == "fenced" or (self.mode == "undecided" and FENCE_OPEN.startswith(head))
        opener = FENCE_OPEN if fenced else OPEN
        if head.startswith(opener):
            name, args = partial_call(head[len(opener):])
        elif opener.startswith(head):  # cut inside the opener itself
            name, args = None, ""
        else:  # not a call (the grammar allows none here): leave it as text
            return buffer, [], []
        call = self.make_call(name, args, new_call_id(), self.index)  # type: ignore[arg-type]
        self.index += 1
        self.calls.append(call)
        return "", [], [call]


# a cut call's body (after its opener): the name, as far as written, then the arguments
_NAME_RE = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)(")?', re.DOTALL)
_ARGS_RE = re.compile(r',\s*"arguments"\s*:\s*(.*)\Z', re.DOTALL)


def partial_call(body: str) -> tuple[str | None, str]:
    """(name, arguments text) of a call cut short, each as far as written; `body`: the text after its opener.
    The name is None before its string opened; the arguments are "" before they started and exactly the
    object when the cut came after it (in the call's closing brace or tag)."""
    m = _NAME_RE.match(body)
    if m is None:
        return None, ""
    raw = m.group(1)
    try:
        name = json.loads(f'"{raw}"')
    except json.JSONDecodeError:  # cut inside an escape sequence
        name = json.loads(f'"{raw[:raw.rfind(chr(92))]}"')
    if m.group(2) is None:
        return name, ""
    args = _ARGS_RE.match(body, m.end())
    return name, _core._written_arguments(args.group(1)) if args else ""


CUT = "the reply was cut (max_tokens, or a stop string) before this call was complete; its name and arguments are " \
      "as far as they were written"


def cut_reply(text: str) -> tuple[str, list[ToolCall], list[InvalidToolCall]]:
    """A reply cut by max_tokens (or a stop string), as ChatOpenAI reports one: (its text, the complete calls,
    the cut call in `invalid_tool_calls` with its name and arguments as far as written). Markup of a cut call,
    even a piece of its opener, is never text; a reply cut in free text is all text."""
    streamer = ToolCallStreamer()
    content, done = streamer.feed(text)
    tail, late, cut = streamer.cut_short()
    calls = [tool_call(name=c["name"], args=json.loads(c["args"]), id=c["id"]) for c in done + late]
    invalid = [invalid_tool_call(name=c["name"], args=c["args"], id=c["id"], error=CUT) for c in cut]
    return content + tail, calls, invalid
