"""Streaming helpers: turn committed token ids into text deltas and partial objects."""

from __future__ import annotations

from typing import Any, Sequence


class IncrementalDetokenizer:
    """Emits only new text, holding back a trailing incomplete UTF-8 character (byte-level BPE can split one
    character across tokens)."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.text = ""  # everything decoded so far
        self.emitted = 0  # characters already handed out

    def push(self, ids: Sequence[int]) -> str:
        self.ids.extend(ids)
        self.text = text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        if text.endswith("\ufffd"):
            return ""
        delta, self.emitted = text[self.emitted :], len(text)
        return delta


def partial_json(text: str) -> Any:
    """The object parsed so far from incomplete JSON text (LangChain's tolerant parser), or None."""
    from langchain_core.utils.json import parse_partial_json

    try:
        return parse_partial_json(text)
    except Exception:  # an unfinished number or literal that cannot be closed yet
        return None
