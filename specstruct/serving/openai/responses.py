"""Response bodies in OpenAI's shapes: chat.completion, text_completion, their stream chunks (SSE frames)."""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from specstruct.serving.openai.assemble import merge, speculation, usage


def _frame(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"


DONE = b"data: [DONE]\n\n"


@dataclass
class Shape:
    """The fixed parts of one response: chat or text completion, its id, time and model name."""

    chat: bool
    model: str
    include_usage: bool = False
    id: str = field(default="")
    created: int = field(default_factory=lambda: int(time.time()))

    def __post_init__(self) -> None:
        self.id = self.id or ("chatcmpl-" if self.chat else "cmpl-") + uuid.uuid4().hex[:24]

    def _head(self, chunk: bool) -> dict[str, Any]:
        kind = ("chat.completion" if self.chat else "text_completion") + (".chunk" if chunk and self.chat else "")
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model,
                "system_fingerprint": None}

    # -- streaming --------------------------------------------------------------------------------------
    def chunk(self, delta: dict[str, Any], finish_reason: str | None = None, stats: Any = None) -> bytes:
        body = self._head(True)
        if self.chat:
            body["choices"] = [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}]
        else:
            body["choices"] = [{"index": 0, "text": delta.get("content", ""), "logprobs": None,
                                "finish_reason": finish_reason}]
        if self.include_usage:
            body["usage"] = None
        if stats is not None:
            body["specstruct"] = speculation(stats)
        return _frame(body)

    def usage_chunk(self, stats: Any) -> bytes:
        body = self._head(True)
        body.update(choices=[], usage=usage(stats), specstruct=speculation(stats))
        return _frame(body)

    @staticmethod
    def error_chunk(error: dict[str, Any]) -> bytes:
        return _frame(error)

    # -- whole responses --------------------------------------------------------------------------------
    def body(self, deltas: list[dict[str, Any]], finish_reason: str, stats: Any) -> dict[str, Any]:
        content, calls = merge(deltas)
        out = self._head(False)
        if self.chat:
            message: dict[str, Any] = {"role": "assistant", "content": content if (content or not calls) else None,
                                       "refusal": None}
            if calls:
                message["tool_calls"] = calls
            out["choices"] = [{"index": 0, "message": message, "logprobs": None, "finish_reason": finish_reason}]
        else:
            out["choices"] = [{"index": 0, "text": content, "logprobs": None, "finish_reason": finish_reason}]
        out["usage"] = usage(stats)
        out["specstruct"] = speculation(stats)
        return out
