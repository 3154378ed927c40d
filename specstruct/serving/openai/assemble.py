"""Engine chunks -> OpenAI deltas: text, and tool calls parsed from Qwen's `<tool_call>` blocks.

One path serves both modes: a non-streaming response is the concatenation of the deltas a stream would send.
A tool call is sent as OpenAI streams it: a first delta with `index`, `id`, `type`, `function.name` and empty
`arguments`, then a delta with `index` and the arguments. When the tokenizer holds the call markers as added
tokens (Qwen2.5), the streamed text hides them, so a tool-mode reply is parsed from its tokens at the end."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from specstruct.constraints.tools import grammar as tool_core
from specstruct.errors import IncompleteOutputError

from specstruct.serving.openai.translate import EngineCall


def call_deltas(call: dict[str, Any]) -> list[dict[str, Any]]:
    i = call["index"]
    return [{"tool_calls": [{"index": i, "id": call["id"], "type": "function",
                             "function": {"name": call["name"], "arguments": ""}}]},
            {"tool_calls": [{"index": i, "function": {"arguments": call["arguments"]}}]}]


def usage(stats: Any) -> dict[str, Any]:
    """OpenAI's usage object; `prompt_tokens_details.cached_tokens`: prompt tokens the prefix cache served."""
    p, c = int(getattr(stats, "prompt_tokens", 0)), int(getattr(stats, "new_tokens", 0))
    cached = int(getattr(stats, "cached_prompt_tokens", 0) or 0)
    return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c,
            "prompt_tokens_details": {"cached_tokens": cached}}


def speculation(stats: Any) -> dict[str, Any]:
    """The extra `specstruct` field: how the reply was decoded (acceptance, tokens per target pass, ...)."""
    d = stats.to_dict() if hasattr(stats, "to_dict") else {}
    d["k_histogram"] = {str(k): v for k, v in (d.get("k_histogram") or {}).items()}
    return d


@dataclass
class Assembler:
    """Feeds chunk texts, yields delta dicts (`{"content": ...}` or `{"tool_calls": [...]}`)."""

    tokenizer: Any
    call: EngineCall
    streamer: tool_core.ToolCallStreamer | None = None
    hidden_markers: bool = False
    result: Any = None
    finish_reason: str = "stop"
    stats: Any = None
    calls: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.call.mode == "tools":
            self.streamer = tool_core.ToolCallStreamer()
            self.hidden_markers = bool(tool_core.special_markers(self.tokenizer))

    def feed(self, chunk: Any) -> list[dict[str, Any]]:
        if chunk.result is not None:
            self.result = chunk.result
        if not chunk.text or self.hidden_markers:
            return []
        if self.streamer is None:
            return [{"content": chunk.text}]
        text, calls = self.streamer.feed(chunk.text)
        return self._out(text, calls)

    def _out(self, text: str, calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
        out = [{"content": text}] if text else []
        for c in calls:
            self.calls.append(c)
            out += call_deltas(c)
        return out

    def finish(self, cut: IncompleteOutputError | None = None) -> list[dict[str, Any]]:
        """The last deltas; sets `finish_reason` and `stats`. `cut`: max_tokens or a stop string ended a
        constrained reply before it was complete (finish_reason "length" or "stop", as OpenAI reports them)."""
        if cut is not None:
            text, ids, self.finish_reason, self.stats = cut.text, cut.token_ids, cut.reason, cut.stats
        else:
            r = self.result
            text, ids, self.finish_reason, self.stats = r.text, r.token_ids, r.finish_reason, r.stats
        if self.streamer is None:
            return []
        if self.hidden_markers:
            full = tool_core.reply_text(self.tokenizer, text, ids, self.call.tools)
            content, parsed = tool_core.parse_tool_calls(full)
            calls = [self.streamer.add_call(c) for c in parsed]
            if cut is not None:  # a call cut short stays a call, with the arguments written so far
                content, partial = self.streamer.cut(content)
                calls += partial
            out = self._out(content, calls)
        else:
            out = self._out(*self.streamer.cut()) if cut is not None else []  # a call cut short, as far as written
            out += self._out(*self.streamer.finish())
        if self.calls and cut is None:
            self.finish_reason = "tool_calls"
        return out


def merge(deltas: list[dict[str, Any]]) -> tuple[str, list[dict[str, Any]]]:
    """(content, tool_calls) of a whole reply from its deltas, in the non-streaming response's shape."""
    content = "".join(d.get("content", "") for d in deltas)
    calls: dict[int, dict[str, Any]] = {}
    for d in deltas:
        for tc in d.get("tool_calls", []):
            entry = calls.setdefault(tc["index"], {"id": None, "type": "function",
                                                   "function": {"name": "", "arguments": ""}})
            entry["id"] = tc.get("id") or entry["id"]
            entry["function"]["name"] += tc.get("function", {}).get("name", "")
            entry["function"]["arguments"] += tc.get("function", {}).get("arguments", "")
    return content, [calls[i] for i in sorted(calls)]
