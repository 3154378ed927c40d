"""Tool calling for Qwen-style (Hermes) chat templates, enforced by a Lark grammar that llguidance runs.

Qwen2.5 (and Hermes-style templates generally) ask the model to answer a tool call as

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

one block per call, blocks separated by a newline. Left free (tool_choice="auto"), Qwen2.5-Coder usually
writes a call as a fenced JSON block instead (```json {"name": ..., "arguments": ...} ```), so "auto" also
accepts that form as a call, constrained the same way. `tool_grammar` turns a list of OpenAI tool dicts and a
`tool_choice` into a grammar whose calls can only name a bound tool and whose arguments can only match
that tool's JSON schema (llguidance embeds a JSON schema in Lark with `%json { ... }`). `parse_tool_calls`
reads the generated text back into plain call dicts `{"id", "name", "arguments"}`, and `ToolCallStreamer`
does the same incrementally for streaming.

Used by the OpenAI-compatible server and by langchain-specstruct (which wraps the dicts in LangChain types);
nothing here imports LangChain.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any, Sequence

from specstruct.constraints.llguidance.grammar_probe import trust
from specstruct.errors import InvalidParameterError
from specstruct.constraints.tools.schema import call_schema, check_tools, tool_name

OPEN, CLOSE = "<tool_call>", "</tool_call>"
FENCE_OPEN, FENCE_CLOSE = "```json\n", "\n```"

_CALL_RE = re.compile(re.escape(OPEN) + r"\s*(\{.*?\})\s*" + re.escape(CLOSE), re.DOTALL)
# exactly the grammar's `fenced` branch: anything looser is free text the grammar never checked as a call
_FENCED_RE = re.compile(rf"\A{re.escape(FENCE_OPEN)}(\{{.*\}}){re.escape(FENCE_CLOSE)}\n?\Z", re.DOTALL)
# a call max_tokens cut short: its name once written, and whatever of its arguments came after
_PARTIAL_RE = re.compile(re.escape(OPEN) + r'\s*\{"name":\s*"((?:[^"\\]|\\.)*)"(?:,\s*"arguments":\s*(.*)|.*)\Z',
                         re.DOTALL)


def _written_arguments(raw: str) -> str:
    """A cut call's arguments as far as they were written: the whole JSON object when the cut came after it (the
    call's closing brace and tag, cut or not, are not part of it), else the partial text."""
    try:
        _, end = json.JSONDecoder().raw_decode(raw)
    except json.JSONDecodeError:
        return raw
    return raw[:end]


def _held_back(text: str) -> int:
    """How many characters at the end of streamed text to hold back: a partial `<tool_call>` and the whitespace
    before it (text before a call ends stripped, as parse_tool_calls gives it)."""
    tail = next((k for k in range(min(len(text), len(OPEN) - 1), 0, -1) if OPEN.startswith(text[-k:])), 0)
    rest = text[:len(text) - tail]
    return tail + len(rest) - len(rest.rstrip())


def _rust_escape(ch: str) -> str:
    """Escape one character for a Rust `regex` character class or literal."""
    return "\\" + ch if ch in "\\.+*?()|[]{}^$#&-~/" else ch


def not_prefixed_by(*prefixes: str) -> str:
    """A regex (no lookarounds: llguidance uses Rust's `regex`) for non-empty text that starts with none of
    `prefixes`. Built over their trie: at each node, a character that leaves the trie frees the rest of the
    text; stopping inside the trie is fine unless a whole prefix has been read."""
    trie: dict = {}
    for p in prefixes:
        node = trie
        for ch in p:
            node = node.setdefault(ch, {})
        node[""] = {}  # end of a prefix

    def alternatives(node: dict) -> list[str]:
        kids = [c for c in node if c]
        alts = ["[^" + "".join(_rust_escape(c) for c in kids) + "](.|\\n)*"]
        for c in kids:
            child = node[c]
            if "" in child:
                continue  # a full prefix: nothing that starts here is free text
            alts.append(_rust_escape(c) + "(" + "|".join(["", *alternatives(child)]) + ")")
        return alts

    return "(" + "|".join(alternatives(trie)) + ")"


def _marker(text: str, special: set[str]) -> str:
    """A Lark item for a marker: a token reference `<tool_call>` when the tokenizer has it as one added token
    (llguidance then treats it as a special token whose bytes are not ordinary text), else a string literal."""
    return text if text in special else json.dumps(text)


def special_markers(tokenizer: Any) -> set[str]:
    """The tool-call markers that `tokenizer` holds as single added tokens. llguidance treats every added
    token as special, even those HF marks `special=False` (Qwen2.5's `<tool_call>`), so the grammar must
    name them as tokens: a string literal would be matched against text bytes and reject the token."""
    decoder = getattr(tokenizer, "added_tokens_decoder", None) or {}
    return {t.content for t in decoder.values() if t.content in (OPEN, CLOSE)}


def select_tools(tools: Sequence[dict[str, Any]], tool_choice: Any) -> tuple[list[dict[str, Any]], str]:
    """Normalise `tool_choice` to (allowed tools, mode) with mode in {"auto", "required", "none"}.

    Accepts "auto", "any", "required", "none", True (= required), None (= auto), a tool name, or an
    OpenAI-style `{"type": "function", "function": {"name": ...}}` dict.
    """
    tools = check_tools(tools)
    if tool_choice in (None, "auto"):
        return tools, "auto"
    if tool_choice in ("any", "required", True):
        return tools, "required"
    if tool_choice in ("none", False):
        return [], "none"
    name = tool_choice
    if isinstance(tool_choice, dict):
        function = tool_choice.get("function")
        if function is not None and not isinstance(function, dict):
            raise InvalidParameterError(f"tool_choice={tool_choice!r}: 'function' must be an object naming the tool, "
                             '{"type": "function", "function": {"name": "..."}}')
        name = (function or {}).get("name") or tool_choice.get("name")
    chosen = [t for t in tools if tool_name(t) == name]
    if not chosen:
        raise InvalidParameterError(
            f"tool_choice={tool_choice!r} names no bound tool; bound tools are "
            f"{[tool_name(t) for t in tools]}. Pass one of those names, or 'auto', 'any' or 'none'."
        )
    return chosen, "required"


def tool_grammar(
    tools: Sequence[dict[str, Any]], tool_choice: Any = "auto", tokenizer: Any = None, parallel: bool = True
) -> str:
    """The Lark grammar for a reply given bound `tools` and `tool_choice`.

    - "auto": free text that starts with neither `<tool_call>` nor a ```json fence, or one or more
      `<tool_call>` blocks, or one fenced JSON call;
    - "any"/"required"/a name: one or more `<tool_call>` blocks (of the named tool only, for a name);
    - "none": free text.
    Free text never contains `<tool_call>` (a call in it would be unchecked); with `<tool_call>` as a special
    token, "auto" also allows text before the calls.
    `parallel=False` allows a single call. `tokenizer` decides whether the markers are special tokens.
    A newline may follow the last call (Qwen2.5 writes one before EOS; without it, it is forced into
    another call).
    """
    allowed, mode = select_tools(tools, tool_choice)
    no_call = f" & ~/(?s:.*){re.escape(OPEN)}(?s:.*)/"  # free text never holds a call marker (an unchecked call)
    if mode == "none" or not allowed:
        return trust(f"start: TEXT\nTEXT: /{not_prefixed_by(OPEN)}/{no_call}\n")
    special = special_markers(tokenizer) if tokenizer is not None else set()
    # With the marker as one special token, text may come before the calls (Qwen writes "Let me check.\n" first):
    # the token ends the text unambiguously. Spelled out in characters, text then calls cannot be lexed apart.
    lines = [
        "start: " + (("TEXT | TEXT? calls | fenced" if OPEN in special else "TEXT | calls | fenced")
                     if mode == "auto" else "calls"),
        'calls: call ("\\n" call)* "\\n"?' if parallel else 'calls: call "\\n"?',
        f'call: {_marker(OPEN, special)} "\\n" body "\\n" {_marker(CLOSE, special)}',
        "body: %json " + json.dumps(call_schema(allowed)),
    ]
    if mode == "auto":
        lines += [f"fenced: {json.dumps(FENCE_OPEN)} body {json.dumps(FENCE_CLOSE)} \"\\n\"?",
                  f"TEXT: /{not_prefixed_by(OPEN, FENCE_OPEN)}/{no_call}"]
    return trust("\n".join(lines) + "\n")  # written here, not by a user: no loop probe needed


def _hidden_markers(tokenizer: Any) -> bool:
    ids = [tokenizer.convert_tokens_to_ids(m) for m in special_markers(tokenizer)]
    return any(tokenizer.decode([i], skip_special_tokens=True) == "" for i in ids if isinstance(i, int))


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def load_call(body: str) -> dict[str, Any]:
    """`{"name", "arguments"}` of one call's JSON body; ValueError when it is not a call."""
    try:
        data = json.loads(body)
    except json.JSONDecodeError as e:
        raise ValueError(f"tool call is not valid JSON ({e}): {body!r}") from e
    return {"name": data["name"], "arguments": data.get("arguments") or {}}


def parse_tool_calls(text: str) -> tuple[str, list[dict[str, Any]]]:
    """Split generated text into (free text, calls `{"id", "name", "arguments": dict}`): `<tool_call>` blocks
    anywhere, or a reply that is one fenced JSON call. Raises ValueError on a malformed call block."""
    fenced = _FENCED_RE.match(text)
    if fenced:
        data = json.loads(fenced.group(1))
        if isinstance(data, dict) and set(data) == {"name", "arguments"}:
            return "", [{"id": new_call_id(), **load_call(fenced.group(1))}]
    calls = [{"id": new_call_id(), **load_call(m.group(1))} for m in _CALL_RE.finditer(text)]
    content = _CALL_RE.sub("", text).strip() if calls else text
    return content, calls


def reply_text(tokenizer: Any, text: str, token_ids: Sequence[int], tools: Any) -> str:
    """The reply text to parse for calls: `text` itself (cut at a stop string), unless the markers are added tokens
    that `skip_special_tokens` hides (marked special); then the tokens decoded again with them kept (EOS dropped;
    a stop string's cut is not re-applied there). Qwen2.5's markers are not hidden."""
    if not (tools and _hidden_markers(tokenizer)):
        return text
    ids = [t for t in token_ids if t != tokenizer.eos_token_id]
    return tokenizer.decode(ids, skip_special_tokens=False)


@dataclass
class ToolCallStreamer:
    """Turns streamed text into (text delta, completed calls) pairs.

    Text that could still become a call opener is held back; each completed `<tool_call>` block becomes one
    call `{"index", "id", "name", "arguments": JSON text}` (see `make_call`) as soon as its closing tag
    arrives; a fenced call when the stream ends (`finish`).
    """

    buffer: str = ""
    index: int = 0
    mode: str = "undecided"  # "text", "tags" or "fenced"
    calls: list[Any] = field(default_factory=list)

    def feed(self, text: str) -> tuple[str, list[Any]]:
        self.buffer += text
        if self.mode == "undecided":
            head = self.buffer.lstrip()
            if head.startswith(OPEN):
                self.mode = "tags"
            elif self.buffer.startswith(FENCE_OPEN):  # as the grammar's fenced call: at the very start
                self.mode = "fenced"
            elif OPEN.startswith(head) or FENCE_OPEN.startswith(self.buffer):
                return "", []  # could still become a call: wait
            else:
                self.mode = "text"
        if self.mode == "text":
            at = self.buffer.find(OPEN)
            if at >= 0:  # calls after text (the grammar allows it where the marker is one special token)
                out, self.buffer, self.mode = self.buffer[:at].rstrip(), self.buffer[at:], "tags"
                return out, self._drain()
            keep = _held_back(self.buffer)
            out, self.buffer = self.buffer[:len(self.buffer) - keep], self.buffer[len(self.buffer) - keep:]
            return out, []
        return "", self._drain() if self.mode == "tags" else []

    def make_call(self, name: str, arguments: str, call_id: str, index: int) -> Any:
        """One streamed call; subclasses return their framework's type."""
        return {"index": index, "id": call_id, "name": name, "arguments": arguments}

    def add_call(self, call: dict[str, Any]) -> Any:
        """Record a parsed call (`{"name", "arguments": dict}`) as the next streamed call."""
        args = json.dumps(call["arguments"], ensure_ascii=False)
        chunk = self.make_call(call["name"], args, call.get("id") or new_call_id(), self.index)
        self.index += 1
        self.calls.append(chunk)
        return chunk

    def _drain(self) -> list[Any]:
        out = []
        while (m := _CALL_RE.search(self.buffer)) is not None:
            out.append(self.add_call(load_call(m.group(1))))
            self.buffer = self.buffer[m.end():]
        return out

    def cut(self, text: str | None = None) -> tuple[str, list[Any]]:
        """max_tokens ended the reply inside a call: (the text before it, that call with the arguments written so
        far, unparsable JSON, as OpenAI reports a cut call). `text`: the reply's rest, else what is held back."""
        rest = self.buffer if text is None else text
        m = _PARTIAL_RE.search(rest)
        if m is None:  # cut before the call's name was complete: nothing to report but the text before it
            opened = rest.find(OPEN)
            self.buffer = ""
            return (rest[:opened] if opened >= 0 else rest) if text is not None else "", []
        self.buffer = ""
        call = self.make_call(json.loads(f'"{m.group(1)}"'), _written_arguments(m.group(2) or ""), new_call_id(),
                              self.index)
        self.index += 1
        self.calls.append(call)
        return (rest[: m.start()] if text is not None else ""), [call]  # held-back text between calls is dropped

    def finish(self) -> tuple[str, list[Any]]:
        """At the end of the stream: (text still held back, a fenced call if the reply was one)."""
        buffer, self.buffer = self.buffer, ""
        if self.mode == "fenced":
            content, calls = parse_tool_calls(buffer)
            return content, [self.add_call(c) for c in calls]
        return ("" if self.mode == "tags" else buffer), []
