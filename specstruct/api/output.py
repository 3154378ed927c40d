"""From a request's committed tokens to text: the final text of a finished request (cut at stops, complete under its
constraint or IncompleteOutputError), and a stream's chunks: text deltas (with the partial object in JSON modes), then
a last chunk with the validated Result. Shared by `run`, `stream` and their asyncio twins."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

from specstruct.spec import stops
from specstruct.errors import IncompleteOutputError, InvalidParameterError, ValidationRetryError
from specstruct.config import SpecConfig
from specstruct.constraints.base import Constraint
from specstruct.engine.request import Output
from specstruct.types.output import OutputSpec
from specstruct.results import Chunk, Result
from specstruct.api.streaming import IncrementalDetokenizer, partial_json

RETRYABLE = (ValueError, SyntaxError, TypeError)  # pydantic.ValidationError is a ValueError


def deadline(timeout: float | None) -> float | None:
    """A `timeout=` in seconds as a time.monotonic() deadline (None or inf: no limit)."""
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or math.isnan(timeout) or timeout < 0:
        raise InvalidParameterError(f"timeout={timeout!r}: give seconds as a number >= 0 (None or float('inf'): "
                                    "no limit)")
    return None if timeout == float("inf") else time.monotonic() + timeout


@dataclass(frozen=True)
class Ending:
    """What turns a finished request's Output into the call's text: the tokenizer, the output spec, its compiled
    constraint (at its start: does a cut text still parse?) and the call's config."""

    tokenizer: Any
    spec: OutputSpec
    compiled: Constraint
    cfg: SpecConfig


def final_text(end: Ending, decode: Output) -> str:
    """The final text (cut before a stop string; code mode: before the closing fence). A constrained output
    is a whole value or this raises: when max_new_tokens or a stop string cut it short."""
    spec, cfg = end.spec, end.cfg
    full = end.tokenizer.decode(decode.token_ids, skip_special_tokens=True)
    text = stops.cut(full, cfg.stop, code_fence=spec.spec.mode == "code")
    if text != full and spec.spec.mode not in ("text", "code") and not end.compiled.accepts(text):
        hit = min((s for s in cfg.stop if s in full), key=full.find)
        raise IncompleteOutputError(
            f"the stop string {hit!r} cut the {spec.spec.mode} output short at {text[:200]!r}, which is not a "
            "complete value; remove that stop string (constrained outputs end by themselves)",
            text, decode.token_ids, decode.stats, reason="stop")
    if (decode.finish_reason == "length" and spec.spec.mode not in ("text", "code")
            and not decode.complete):
        raise IncompleteOutputError(
            f"max_new_tokens={cfg.max_new_tokens} ran out before the {spec.spec.mode} output was complete; "
            f"raise max_new_tokens. Partial output: {text[:200]!r}", text, decode.token_ids, decode.stats)
    return text


class StreamChunks:
    def __init__(self, end: Ending):
        self.end, self.spec = end, end.spec
        self.detok = IncrementalDetokenizer(end.tokenizer, end.cfg.stop, code_fence=end.spec.spec.mode == "code")
        self.json_mode = end.spec.spec.mode == "json"

    def push(self, tokens: list[int]) -> Chunk | None:
        delta = self.detok.push(tokens)
        return Chunk(text=delta, partial=partial_json(self.detok.safe_text) if self.json_mode else None) if delta else None

    def final(self, out: Output) -> Chunk:
        text = final_text(self.end, out)
        try:
            value = self.spec.parse(text, out.token_ids)
        except RETRYABLE as err:
            raise ValidationRetryError(f"the streamed output failed validation: {err}",
                                       [{"text": text, "error": str(err), "stats": out.stats}]) from err
        result = Result(value=value, text=text, token_ids=out.token_ids, stats=out.stats,
                        finish_reason=out.finish_reason)
        return Chunk(text=text[self.detok.emitted:], partial=partial_json(text) if self.json_mode else None,
                     result=result)  # `partial` stays the parsed JSON (a dict) to the end; the value is result.value
