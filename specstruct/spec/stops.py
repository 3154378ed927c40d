"""Where a stop string ends the output, as pure functions over text, shared by the decode loop (which stops
there), `Result.text` (which is cut there) and streaming (which never hands out text past it).

Code mode adds one implicit stop: the fence that *closes* a ```` ``` ```` block the output opened with. A fence
that opens the block (even after leading newlines) is never a stop.

While decoding, `StopScanner` finds the same stop with work linear in the output: each token is decoded a bounded
number of times (`IncrementalText`) and each stop is searched for only in the new text plus its own length before it.
"""

from __future__ import annotations

import bisect
import re
from typing import Callable, Sequence

FENCE = "\n```"
_OPENING = re.compile(r"\s*```[\w+.-]*[ \t]*(\n|$)")
_BEFORE_OPENING = re.compile(r"\s*`{0,2}")  # text that may still become an opening fence


def _fence_index(text: str) -> int | None:
    opening = _OPENING.match(text)
    if opening is None:
        start = 0
    elif not opening.group(1):
        return None  # still writing the opening fence's line
    else:
        start = opening.end() - 1  # the newline that ends the opening line may start the closing fence
    i = text.find(FENCE, start)
    return None if i < 0 else i


def stop_index(text: str, stops: Sequence[str], code_fence: bool = False) -> int | None:
    """The index where the earliest stop string (or, with `code_fence`, the closing fence) starts in `text`."""
    found = [i for i in (text.find(s) for s in stops if s) if i >= 0]
    if code_fence and (i := _fence_index(text)) is not None:
        found.append(i)
    return min(found) if found else None


def cut(text: str, stops: Sequence[str], code_fence: bool = False) -> str:
    """`text` up to (without) its earliest stop."""
    i = stop_index(text, stops, code_fence)
    return text if i is None else text[:i]


def held_back(text: str, stops: Sequence[str], code_fence: bool = False) -> int:
    """How many trailing characters of `text` could still become the start of a stop string: a stream holds
    them back until the next token decides."""
    ordered = sorted({s for s in stops if s} | ({FENCE} if code_fence else set()))
    return _hold(text, ordered, {s[0] for s in ordered}, max(map(len, ordered), default=0))


def _hold(text: str, ordered: list[str], firsts: set[str], longest: int) -> int:
    """`held_back` over the stops sorted: the longest tail that is a proper prefix of one is found by bisection,
    trying only the last (longest stop - 1) characters where a stop's first character stands, longest first."""
    for j in range(max(0, len(text) - longest + 1), len(text)):
        if text[j] not in firsts:
            continue
        tail = text[j:]
        i = bisect.bisect_left(ordered, tail)
        if i < len(ordered) and ordered[i] == tail:  # a whole stop: only a longer one can still begin here
            i += 1
        if i < len(ordered) and ordered[i].startswith(tail):
            return len(tail)
    return 0


class IncrementalText:
    """The text of a growing list of token ids, decoded a few tokens at a time: each push decodes the new ids and
    those of the previous push, never all of them again. The new text is the difference of two decodes that start at
    the same earlier token (as vLLM does), so a tokenizer that merges or drops spaces at the start of a decode still
    gives the whole decode's text. A trailing incomplete UTF-8 character (U+FFFD) or an empty piece waits for the
    next token, for at most WAIT tokens."""

    WAIT = 8

    def __init__(self, decode: Callable[[list[int]], str]):
        self.decode = decode
        self.ids: list[int] = []
        self.text = ""
        self._prefix = self._read = 0  # ids[_prefix:_read]: context already in `text`; ids[_read:]: not yet

    def push(self, ids: Sequence[int]) -> str:
        """Add `ids`; returns the text they completed ("" while a character is incomplete)."""
        self.ids.extend(ids)
        before = self.decode(self.ids[self._prefix : self._read])
        after = self.decode(self.ids[self._prefix :])
        if len(self.ids) - self._read < self.WAIT and (len(after) <= len(before) or after.endswith("\ufffd")):
            return ""
        delta = after[len(before) :]
        self._prefix, self._read = self._read, len(self.ids)
        self.text += delta
        return delta

    def peek(self, more: Sequence[int]) -> str:
        """The text of the ids pushed so far and `more`, pushing nothing: ids still waiting to complete a character
        included, decoded from the same earlier token as `push` (so a tokenizer's leading-space rule holds)."""
        before = self.decode(self.ids[self._prefix : self._read])
        after = self.decode(self.ids[self._prefix :] + list(more))
        return self.text + after[len(before) :]


class StopScanner:
    """The first stop string (code mode: also the closing fence) in an output that grows token by token. `push`
    gives the token a one-token-at-a-time search of the whole text would stop at. Each new character is checked once
    per distinct stop length (a set lookup of the text ending there), so the work is linear in the output and does
    not grow with the number of stops; `examined` counts the characters hashed."""

    def __init__(self, decode: Callable[[list[int]], str], stops: Sequence[str], code_fence: bool = False):
        self.code_fence = code_fence
        self.text = IncrementalText(decode)
        self.ends: list[int] = []  # len(text) after each token
        self.start: int | None = None  # where the earliest stop in the text starts, once one was found
        self.examined = 0
        self._by_length: dict[int, set[str]] = {}
        for s in stops:
            if s:
                self._by_length.setdefault(len(s), set()).add(s)
        self._lengths = sorted(self._by_length)
        self._ordered = sorted({s for s in stops if s} | ({FENCE} if code_fence else set()))
        self._firsts = {s[0] for s in self._ordered}
        self._longest = max(map(len, self._ordered), default=0)
        self._scanned = 0  # text[:_scanned] was searched: no stop lies wholly inside it
        self._fence_from: int | None = None  # where a closing fence may start, once the opening line is decided

    def push(self, ids: Sequence[int]) -> int | None:
        """Add the next committed `ids`: the number of tokens, of all pushed, up to the one that completed the first
        stop, or None (then, and only then, more may be pushed)."""
        for t in ids:
            self.text.push([t])
            self.ends.append(len(self.text.text))
        text, first_end, start = self.text.text, None, None
        for end in range(self._scanned + 1, len(text) + 1):
            for n in self._lengths:
                if n > end:
                    break
                self.examined += n
                if text[end - n : end] in self._by_length[n]:
                    first_end = first_end or end
                    start = end - n if start is None else min(start, end - n)
        if self.code_fence and (i := self._fence(text)) is not None:
            first_end = i + len(FENCE) if first_end is None else min(first_end, i + len(FENCE))
            start = i if start is None else min(start, i)
        self._scanned = len(text)
        if first_end is None:
            return None
        self.start = start
        return bisect.bisect_left(self.ends, first_end) + 1

    def held_back(self) -> int:
        """`held_back` of the text so far (the stops sorted once)."""
        return _hold(self.text.text, self._ordered, self._firsts, self._longest)

    def _fence(self, text: str) -> int | None:
        if self._fence_from is None:
            opening = _OPENING.match(text)
            if (opening is not None and not opening.group(1)) or (opening is None and _BEFORE_OPENING.fullmatch(text)):
                return None  # the opening line is not decided yet: no closing fence can be
            self._fence_from = frm = 0 if opening is None else opening.end() - 1
        else:
            frm = max(self._fence_from, self._scanned - len(FENCE) + 1)
        self.examined += len(text) - frm
        i = text.find(FENCE, frm)
        return None if i < 0 else i
