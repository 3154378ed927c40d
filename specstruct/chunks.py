"""A stream's chunks from its committed tokens: text deltas (with the partial object in JSON modes), then a last
chunk with the validated Result. Shared by `SpecStruct.stream` and `astream`."""

from __future__ import annotations

import time
from typing import Any

from .errors import ValidationRetryError
from .output_types import OutputSpec
from .results import Chunk, Result
from .streaming import IncrementalDetokenizer, partial_json

RETRYABLE = (ValueError, SyntaxError, TypeError)  # pydantic.ValidationError is a ValueError


def deadline(timeout: float | None) -> float | None:
    """A `timeout=` in seconds as a time.monotonic() deadline (None: no limit)."""
    return None if timeout is None or timeout == float("inf") else time.monotonic() + timeout  # inf: no limit


class StreamChunks:
    def __init__(self, owner: Any, spec: OutputSpec, constraint: Any, cfg: Any):
        self.owner, self.spec, self.constraint, self.cfg = owner, spec, constraint, cfg
        self.detok = IncrementalDetokenizer(owner.tokenizer, cfg.stop, code_fence=spec.spec.mode == "code")
        self.json_mode = spec.spec.mode == "json"

    def push(self, tokens: list[int]) -> Chunk | None:
        delta = self.detok.push(tokens)
        return Chunk(text=delta, partial=partial_json(self.detok.safe_text) if self.json_mode else None) if delta else None

    def final(self, row: Any) -> Chunk:
        text = self.owner._finish(row, self.spec, self.constraint, self.cfg)
        try:
            value = self.spec.parse(text, row.token_ids)
        except RETRYABLE as err:
            raise ValidationRetryError(f"the streamed output failed validation: {err}",
                                       [{"text": text, "error": str(err), "stats": row.stats}]) from err
        result = Result(value=value, text=text, token_ids=row.token_ids, stats=row.stats,
                        finish_reason=row.finish_reason)
        return Chunk(text=text[self.detok.emitted:], partial=partial_json(text) if self.json_mode else None,
                     result=result)  # `partial` stays the parsed JSON (a dict) to the end; the value is result.value
