"""Streaming helpers: turn committed token ids into text deltas and partial objects."""

from __future__ import annotations

import re

from typing import Any, Sequence

from specstruct.spec import stops


class IncrementalDetokenizer:
    """Emits only new text, holding back a trailing incomplete UTF-8 character (byte-level BPE can split one
    character across tokens) and any tail that may still become a stop string, and nothing from a stop on:
    the joined deltas are always a prefix of the final `Result.text`."""

    def __init__(self, tokenizer: Any, stop: Sequence[str] = (), code_fence: bool = False):
        self.stop, self.code_fence = list(stop), code_fence
        self._scan = stops.StopScanner(lambda ids: tokenizer.decode(ids, skip_special_tokens=True), self.stop,
                                       code_fence)  # each token decoded a bounded number of times: linear
        self.emitted = 0  # characters already handed out

    @property
    def text(self) -> str:
        """Everything decoded so far."""
        return self._scan.text.text

    @property
    def safe_text(self) -> str:
        """The text handed out so far."""
        return self.text[: self.emitted]

    def push(self, ids: Sequence[int]) -> str:
        if self._scan.start is not None:  # past a stop: nothing more, ever
            return ""
        self._scan.push(ids)
        text = self.text
        end = self._scan.start
        if end is None:
            end = len(text) - self._scan.held_back()
        if end <= self.emitted:
            return ""
        delta, self.emitted = text[self.emitted : end], end
        return delta


def partial_json(text: str) -> Any:
    """The object parsed so far from incomplete JSON text (pydantic_core's partial parser), or None. A number cut
    after its `.` or exponent mark counts as what precedes it (the parser would drop the key, and `.partial` would
    go backwards: {"score": 1} at `1`, {} at `1.`, {"score": 1.5} at `1.5`)."""
    from pydantic_core import from_json

    if _NUMBER_CUT.search(text) and not _inside_string(text):
        text = _NUMBER_CUT.sub("", text)
    try:
        return from_json(text, allow_partial="trailing-strings")
    except ValueError:  # nothing parseable yet, or an unfinished number or literal that cannot be closed
        return None


_NUMBER_CUT = re.compile(r"(?<=[0-9])(\.?[eE][+-]?|\.)$")


def _inside_string(text: str) -> bool:
    """Whether incomplete JSON text ends inside a string (an odd number of unescaped quotes)."""
    inside, escaped = False, False
    for ch in text:
        if escaped:
            escaped = False
        elif ch == "\\":
            escaped = inside
        elif ch == '"':
            inside = not inside
    return inside
