"""Where a stop string ends the output, as pure functions over text, shared by the decode loop (which stops
there), `Result.text` (which is cut there) and streaming (which never hands out text past it).

Code mode adds one implicit stop: the fence that *closes* a ```` ``` ```` block the output opened with. A fence
that opens the block (even after leading newlines) is never a stop.
"""

from __future__ import annotations

import re
from typing import Callable, Sequence

FENCE = "\n```"
_OPENING = re.compile(r"\s*```[\w+.-]*[ \t]*(\n|$)")


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
    candidates = [s for s in stops if s] + ([FENCE] if code_fence else [])
    hold = 0
    for s in candidates:
        for k in range(min(len(s) - 1, len(text)), hold, -1):
            if text.endswith(s[:k]):
                hold = k
                break
    return hold


def stop_tokens(decode: Callable[[list[int]], str], ids: Sequence[int], stops: Sequence[str],
                code_fence: bool = False) -> int | None:
    """The number of leading tokens of `ids` whose text first contains a stop: the output ends with the token
    that completed it, exactly where one-token-at-a-time decoding would have stopped. None: no stop yet."""
    if stop_index(decode(list(ids)), stops, code_fence) is None:
        return None
    lo, hi = 1, len(ids)  # the text of a longer prefix contains the stop whenever a shorter one does
    while lo < hi:
        mid = (lo + hi) // 2
        if stop_index(decode(list(ids[:mid])), stops, code_fence) is None:
            lo = mid + 1
        else:
            hi = mid
    return lo
