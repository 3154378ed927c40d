"""Tool calling for Qwen-style chat templates, enforced by a Lark grammar that llguidance runs.

Qwen2.5 (and Hermes-style templates generally) ask the model to answer a tool call as

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

one block per call, blocks separated by a newline. `tool_grammar` turns a list of OpenAI tool dicts and a
`tool_choice` into a grammar whose calls can only name a bound tool and whose arguments can only match
that tool's JSON schema (llguidance embeds a JSON schema in Lark with `%json { ... }`). `parse_tool_calls`
reads the generated text back into LangChain `ToolCall`s, and `ToolCallStreamer` does the same
incrementally for streaming.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any, Sequence

from langchain_core.messages.tool import ToolCall, ToolCallChunk, tool_call, tool_call_chunk

OPEN, CLOSE = "<tool_call>", "</tool_call>"

# Qwen's template serialises arguments with `tojson`: ", " and ": " separators, no newlines. Matching that
# exactly keeps the model on familiar ground and makes the punctuation forced text (free to draft).
_JSON_FORMAT = {"whitespace_flexible": False, "key_separator": ": ", "item_separator": ", "}

_CALL_RE = re.compile(re.escape(OPEN) + r"\s*(\{.*?\})\s*" + re.escape(CLOSE), re.DOTALL)


def tool_name(tool: dict[str, Any]) -> str:
    """The function name of an OpenAI tool dict (`{"type": "function", "function": {...}}`)."""
    return tool["function"]["name"]


def _arguments_schema(tool: dict[str, Any]) -> dict[str, Any]:
    """The tool's parameter schema, closed at the top level so the model cannot invent arguments."""
    params = dict(tool["function"].get("parameters") or {})
    params.setdefault("type", "object")
    params.setdefault("properties", {})
    params.setdefault("additionalProperties", False)
    return params


def call_schema(tools: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One JSON schema for a call of any of `tools`: `{"name": <const>, "arguments": <its parameters>}`.

    llguidance wants alternatives as one `anyOf` inside a single `%json` rather than as Lark alternatives.
    """
    variants = [
        {
            "type": "object",
            "properties": {"name": {"const": tool_name(t)}, "arguments": _arguments_schema(t)},
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
        for t in tools
    ]
    return {"x-guidance": _JSON_FORMAT, "anyOf": variants}


def _rust_escape(ch: str) -> str:
    """Escape one character for a Rust `regex` character class or literal."""
    return "\\" + ch if ch in "\\.+*?()|[]{}^$#&-~/" else ch


def not_prefixed_by(prefix: str) -> str:
    """A regex (no lookarounds: llguidance uses Rust's `regex`) for non-empty text that does not start with
    `prefix`: a proper prefix of it, or a proper prefix followed by a character that breaks the match,
    then anything."""
    parts = []
    for i, ch in enumerate(prefix):
        head = "".join(_rust_escape(c) for c in prefix[:i])
        parts.append(f"{head}[^{_rust_escape(ch)}](.|\\n)*")
        if i:
            parts.append(head)  # the text may be a strict prefix of `prefix` and stop there
    return "(" + "|".join(parts) + ")"


def _marker(text: str, special: set[str]) -> str:
    """A Lark item for a marker: a special-token reference `<tool_call>` when the tokenizer has it as a
    special token (its bytes are then not ordinary text), else a string literal."""
    return text if text in special else json.dumps(text)


def special_markers(tokenizer: Any) -> set[str]:
    """The tool-call markers that `tokenizer` holds as *special* added tokens (llguidance then refers to
    them as `<tool_call>`); non-special added tokens are plain text to llguidance."""
    decoder = getattr(tokenizer, "added_tokens_decoder", None) or {}
    return {t.content for t in decoder.values() if getattr(t, "special", False) and t.content in (OPEN, CLOSE)}


def select_tools(tools: Sequence[dict[str, Any]], tool_choice: Any) -> tuple[list[dict[str, Any]], str]:
    """Normalise `tool_choice` to (allowed tools, mode) with mode in {"auto", "required", "none"}.

    Accepts "auto", "any", "required", "none", True (= required), None (= auto), a tool name, or an
    OpenAI-style `{"type": "function", "function": {"name": ...}}` dict.
    """
    tools = list(tools)
    if tool_choice in (None, "auto"):
        return tools, "auto"
    if tool_choice in ("any", "required", True):
        return tools, "required"
    if tool_choice in ("none", False):
        return [], "none"
    name = tool_choice
    if isinstance(tool_choice, dict):
        name = (tool_choice.get("function") or {}).get("name") or tool_choice.get("name")
    chosen = [t for t in tools if tool_name(t) == name]
    if not chosen:
        raise ValueError(
            f"tool_choice={tool_choice!r} names no bound tool; bound tools are "
            f"{[tool_name(t) for t in tools]}. Pass one of those names, or 'auto', 'any' or 'none'."
        )
    return chosen, "required"


def tool_grammar(
    tools: Sequence[dict[str, Any]], tool_choice: Any = "auto", tokenizer: Any = None, parallel: bool = True
) -> str:
    """The Lark grammar for a reply given bound `tools` and `tool_choice`.

    - "auto": free text that does not start with `<tool_call>`, or one or more calls;
    - "any"/"required"/a name: one or more calls (of the named tool only, for a name);
    - "none": free text that does not start with `<tool_call>`.
    `parallel=False` allows a single call. `tokenizer` decides whether the markers are special tokens.
    """
    allowed, mode = select_tools(tools, tool_choice)
    text = f"TEXT: /{not_prefixed_by(OPEN)}/"
    if mode == "none" or not allowed:
        return "start: TEXT\n" + text + "\n"
    special = special_markers(tokenizer) if tokenizer is not None else set()
    lines = [
        "start: " + ("TEXT | calls" if mode == "auto" else "calls"),
        'calls: call ("\\n" call)*' if parallel else "calls: call",
        f'call: {_marker(OPEN, special)} "\\n" body "\\n" {_marker(CLOSE, special)}',
        "body: %json " + json.dumps(call_schema(allowed)),
    ]
    if mode == "auto":
        lines.append(text)
    return "\n".join(lines) + "\n"


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def parse_tool_calls(text: str) -> tuple[str, list[ToolCall]]:
    """Split generated text into (free text, tool calls). Raises ValueError on a malformed call block."""
    calls: list[ToolCall] = []
    for m in _CALL_RE.finditer(text):
        try:
            data = json.loads(m.group(1))
        except json.JSONDecodeError as e:
            raise ValueError(f"tool call is not valid JSON ({e}): {m.group(1)!r}") from e
        calls.append(tool_call(name=data["name"], args=data.get("arguments") or {}, id=new_call_id()))
    content = _CALL_RE.sub("", text).strip() if calls else text
    return content, calls


@dataclass
class ToolCallStreamer:
    """Turns streamed text into (text delta, tool-call chunks) pairs.

    Text that could still become `<tool_call>` is held back; each completed call block becomes one
    `ToolCallChunk` (name, JSON arguments, id, index) as soon as its closing tag arrives.
    """

    buffer: str = ""
    index: int = 0
    in_calls: bool = False
    calls: list[ToolCallChunk] = field(default_factory=list)

    def feed(self, text: str) -> tuple[str, list[ToolCallChunk]]:
        self.buffer += text
        if not self.in_calls:
            stripped = self.buffer.lstrip()
            if stripped.startswith(OPEN):
                self.in_calls = True
            elif OPEN.startswith(stripped):
                return "", []  # could still become a call: wait
            else:
                out, self.buffer = self.buffer, ""
                return out, []
        return "", self._drain()

    def _drain(self) -> list[ToolCallChunk]:
        out = []
        while (m := _CALL_RE.search(self.buffer)) is not None:
            data = json.loads(m.group(1))
            args = json.dumps(data.get("arguments") or {}, ensure_ascii=False)
            out.append(tool_call_chunk(name=data["name"], args=args, id=new_call_id(), index=self.index))
            self.index += 1
            self.buffer = self.buffer[m.end():]
        self.calls.extend(out)
        return out

    def flush(self) -> str:
        """Text still held back at the end of the stream (a lone `<tool` that never became a call)."""
        out = "" if self.in_calls else self.buffer
        self.buffer = ""
        return out
