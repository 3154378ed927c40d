"""Tool calls on the Python API. `engine.run(messages, tools=[...])` with no output type constrains the reply as
the server does (free text that never holds a call, or calls that name a bound tool with arguments matching its
schema) and returns a ToolReply; before, the tools only reached the chat template and a call came back as
unchecked text. With an output type as well, that type decides the reply (the tools only render the history).

    reply = engine.generate(messages, tools=[weather_tool])        # -> ToolReply
    for call in reply.tool_calls: print(call["name"], call["arguments"])
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Sequence

from specstruct.errors import InvalidParameterError
from specstruct.types.output import Grammar, OutputSpec, resolve
from specstruct.constraints.tools.schema import check_tools
from specstruct.constraints.tools.grammar import parse_tool_calls, reply_text, select_tools, tool_grammar


@dataclass
class ToolReply:
    """A reply when tools are bound: `content` is the text outside the calls, `tool_calls` the calls in order,
    each `{"id", "name", "arguments"}` with `arguments` a dict that matches the tool's parameter schema."""

    content: str
    tool_calls: list[dict[str, Any]] = field(default_factory=list)


def reply_spec(tokenizer: Any, output_type: object, tools: Sequence[dict[str, object]] | None,
               tool_choice: object) -> OutputSpec:
    """What a call constrains to: `output_type`, or with tools and no output type, the tool-call grammar."""
    if not tools:
        if tool_choice not in (None, "auto", "none"):
            raise InvalidParameterError(f"tool_choice={tool_choice!r} needs tools: pass tools=[...] (OpenAI tool "
                                        "dicts)")
        return resolve(output_type)
    if output_type is not None:
        if tool_choice not in (None, "none"):
            raise InvalidParameterError(f"tool_choice={tool_choice!r} and an output type exclude each other: the "
                                        "output type decides the reply; drop one of them")
        return resolve(output_type)
    tools = check_tools(tools, distinct=True)
    grammar = Grammar(tool_grammar(tools, tool_choice, tokenizer), instruction="")
    calls_allowed = select_tools(tools, tool_choice)[1] != "none"  # "none": text, even if it looks like a call
    spec = resolve(grammar)

    def parse(text: str, token_ids: Sequence[int]) -> ToolReply:
        if not calls_allowed:
            return ToolReply(text, [])
        content, calls = parse_tool_calls(reply_text(tokenizer, text, token_ids, tools))
        return ToolReply(content, calls)

    return replace(spec, from_tokens=parse)
