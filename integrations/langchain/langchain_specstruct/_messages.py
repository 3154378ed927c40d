"""LangChain messages -> the `{"role", "content", ...}` dicts a Hugging Face chat template renders.

The conventions are the ones transformers' chat templates (Qwen2.5, Hermes, Llama 3.1) expect:
assistant tool calls as `{"type": "function", "function": {"name", "arguments": <dict>}}` (the template
serialises the arguments itself, so they must be a dict, not a JSON string), tool results as
`{"role": "tool", "content", "tool_call_id", "name"}`. Repeated roles and several system messages are
passed through unchanged: the template decides how to render them.
"""

from __future__ import annotations

from typing import Any, Sequence

from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    ChatMessage,
    FunctionMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)

_ROLES = {HumanMessage: "user", AIMessage: "assistant", SystemMessage: "system", ToolMessage: "tool",
          FunctionMessage: "tool"}

# Content-block types that carry no text for the model (a provider's own copy of a tool call, etc.).
_SKIP_BLOCKS = {"tool_use", "tool_call", "function_call", "server_tool_call", "reasoning", "thinking"}


def content_text(content: str | list[Any]) -> str:
    """The text of a message's content: a plain string, or the text blocks of a content list joined.

    Images, audio and files are refused with an error (the local models here read text only)."""
    if isinstance(content, str):
        return content
    parts: list[str] = []
    for block in content:
        if isinstance(block, str):
            parts.append(block)
            continue
        kind = block.get("type")
        if kind == "text":
            parts.append(block.get("text", ""))
        elif kind in _SKIP_BLOCKS:
            continue
        else:
            raise ValueError(
                f"ChatSpecStruct reads text only; got a {kind!r} content block. "
                "Send the content as text (e.g. describe or transcribe it) instead."
            )
    return "".join(parts)


def role_of(message: BaseMessage) -> str:
    if isinstance(message, ChatMessage):  # OpenAI's "developer" is the system role of newer models
        return "system" if message.role == "developer" else message.role
    for cls, role in _ROLES.items():
        if isinstance(message, cls):
            return role
    raise ValueError(f"Cannot render a {type(message).__name__} through a chat template; "
                     "use Human/AI/System/Tool/ChatMessage.")


def to_chat_messages(messages: Sequence[BaseMessage]) -> list[dict[str, Any]]:
    """Convert LangChain messages to chat-template dicts (see the module docstring)."""
    out: list[dict[str, Any]] = []
    for m in messages:
        item: dict[str, Any] = {"role": role_of(m), "content": content_text(m.content)}
        if isinstance(m, AIMessage) and m.tool_calls:
            item["tool_calls"] = [
                {"id": tc.get("id"), "type": "function",
                 "function": {"name": tc["name"], "arguments": tc.get("args") or {}}}
                for tc in m.tool_calls
            ]
        if isinstance(m, ToolMessage):
            item["tool_call_id"] = m.tool_call_id
        if getattr(m, "name", None) and not isinstance(m, (HumanMessage, SystemMessage)):
            item["name"] = m.name
        out.append(item)
    return out
