"""Prompt lookup: extraction copies spans of its input, so when the text written last also occurs earlier in the
context, propose what followed it there (Saxena 2023, "prompt lookup decoding"), filtered by the constraint.

It matches *text*, not token ids: a value the prompt holds as ` Northwind` (one token after a space) is written as
`"North` + `wind` inside a JSON string, and no token n-gram of the output occurs in the prompt. The longest suffix of
the context's text that occurs earlier (most recent occurrence) wins; what followed it is tokenized afresh.

In JSON a match must hold some of the value being written: one that ends in structure (`"city": "`, `, `) matches
the keys and punctuation of earlier values and of the schema, and what followed those is almost never the value
that starts here, while a letter or two after the quote that opens a value was right 15 times in 26 on the JSON
bench. Where the match holds no more than the value and punctuation (` "c`, last seen in the key `, "city"`), the
value is copied from its most recent occurrence that starts a word: its opening quote stands where the source has
a space or a line break.

A copy runs for the policy's length (`lookup_k`), or to the end of the word it is in where that is longer and the
step has room: an address or a name is copied whole more often than it stops inside a word (the pass would end
with the target writing the next piece of it). Inside a JSON string a copy stops where its source's clause ends
(`Hopper|, 85`, `Kyoto|; she`, a full stop, a line break) if the step has room for that much: a value usually ends
there, and the structure guesses (guess.py) close the string and go on with the next key in the same pass.

Elsewhere a match needs MIN_MATCH characters: on the code and prose benches shorter ones were right 5 times in 115,
longer ones 48 in 98 (`python -m benchmarks.lookup_trace --scenario code --limit 3 --min-match 1`).
"""

from __future__ import annotations

import re
from typing import Any, Sequence

from specstruct.constraints.base import Constraint
from specstruct.spec.interfaces import Draft, Setup, Sizing, Traits, encode

STRUCTURE = '"{}[],:'  # JSON's punctuation: a match's text after the last of these is the value being written
MIN_MATCH = 4  # characters a match needs outside JSON
MAX_SUFFIX = 64  # characters of the context's end tried as the match (the longest that occurs earlier wins)
CHARS_PER_TOKEN = 6  # continuation characters tokenized per requested token (plus a few)
# Where a copied JSON string likely ends: punctuation and a space, an opening bracket, a sentence's full stop (not an
# abbreviation's), or a line break (which a JSON string cannot hold)
CLAUSE_END = re.compile(r"[,;:)]\s|\s\(|(?<=\w\w)(?<!Dr|Mr|Ms|St|Jr|Sr|Co|vs)(?<!Mrs|Inc|Ltd)\.(?:\s|$)|(?=\n)")


def longest_earlier(text: str, limit: int = MAX_SUFFIX) -> tuple[int, int]:
    """(length, end) of the longest suffix of `text` (at most `limit` characters) that also occurs ending before
    the end of `text`, and where its most recent such occurrence ends; (0, 0) when not even the last character
    does. Binary search: a suffix that occurs earlier has every shorter suffix occurring earlier too."""
    lo, hi, end = 0, min(limit, len(text) - 1), 0
    while lo < hi:
        mid = (lo + hi + 1) // 2
        at = text.rfind(text[-mid:], 0, len(text) - 1)
        if at >= 0:
            lo, end = mid, at + mid
        else:
            hi = mid - 1
    return lo, end


def _value(text: str) -> str:
    """The text after the last JSON structural character: the value being written, where one is."""
    return text[max(text.rfind(c) for c in STRUCTURE) + 1 :]


def _holds_value(match: str) -> bool:
    """Whether a JSON match holds a letter or digit after its last structural character."""
    return any(c.isalnum() for c in _value(match))


def word_start(text: str, value: str, tries: int = 64) -> int:
    """Where the most recent earlier occurrence of `value` (the end of `text`) that starts a word ends, or -1.
    A value's opening quote stands where its source has a space or a line break: `"c` is the start of the
    address in `at c.okafor@...`, not of the key `"city"`, which the longest match would pick."""
    end = len(text) - 1
    for _ in range(tries):
        at = text.rfind(value, 0, end)
        if at < 0:
            return -1
        if at == 0 or text[at - 1].isspace() or text[at - 1] in "([":
            return at + len(value)
        end = at + len(value) - 1
    return -1


def in_string(text: str) -> bool:
    """Whether JSON `text` ends inside a string, after a letter or digit of it."""
    value = _value(text)
    return 0 < len(value) < len(text) and text[-len(value) - 1] == '"' and value[-1].isalnum()


def copy_from(text: str, json: bool) -> int:
    """Where in `text` the continuation that prompt lookup copies starts (the end of its match), or -1 where no
    match is worth copying from."""
    length, end = longest_earlier(text)
    if not json:
        return end if length >= MIN_MATCH else -1
    if not (length > 0 and _holds_value(text[len(text) - length :])):
        return -1
    value = _value(text)
    around = text[len(text) - length : len(text) - len(value)]  # what the match holds besides the value ('' if
    if not around.strip(STRUCTURE + " ") and (at := word_start(text, value)) >= 0:  # it holds less than the value)
        return at  # the match holds only (some of) the value and punctuation: copy from where the value starts a word
    return end


class PromptLookupDrafter:
    traits = Traits("lookup", switch="use_prompt_lookup", sizing=Sizing.COPY, reads_text=True)
    name = traits.name

    @classmethod
    def create(cls, setup: Setup) -> "PromptLookupDrafter":
        return cls(setup.tokenizer)

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer

    def propose(self, context: Sequence[int], constraint: Constraint, k: int, temperature: float,
                text: str | None = None, room: int | None = None) -> Draft:
        if k <= 0 or not context:
            return Draft([], source=self.name)
        if text is None:
            text = self.tokenizer.decode(list(context))
        end = copy_from(text, constraint.mode == "json")
        if end < 0:
            return Draft([], source=self.name)
        room = max(k, room or k)
        span = CHARS_PER_TOKEN * room + 8
        follow = text[end : end + span]
        m = CLAUSE_END.search(text, end, end + span + 1) if constraint.mode == "json" and in_string(text) else None
        if m and m.start() < end + span:  # (a full stop at the window's edge may be inside a word: not an end)
            clause = encode(self.tokenizer, follow[: m.start() - end])  # the value likely ends there: the guess drafter
            if len(clause) <= room:  # closes it, and the pass goes on with the next key
                return Draft.legal(clause, constraint, self.name)
        ids = encode(self.tokenizer, follow)
        if end + span < len(text) and len(ids) > 1:
            ids = ids[:-1]  # the span may end inside a word: its last token is a fragment
        take = k
        word = len(follow.split(maxsplit=1)[0]) if follow[:1].strip() else 0  # the rest of the word being copied
        if room > k and word:
            take = min(room, max(k, len(encode(self.tokenizer, follow[:word]))))
        return Draft.legal(ids[:take], constraint, self.name)
