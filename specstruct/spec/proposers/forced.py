"""Grammar-forced text: where the constraint admits exactly one continuation *text* (JSON punctuation, the key
of a required property, the rest of an enum value), propose its canonical tokenization for free.

The forced text is usually not a forced *token sequence* (byte-level BPE has several tokenizations of
`{"name": "`), so these are only candidates: the target verifies them like any other draft.
"""

from __future__ import annotations

from typing import Any, Sequence

from specstruct.constraints.base import Constraint
from specstruct.spec.interfaces import Draft, Setup, Sizing, Traits, encode


class ForcedTextDrafter:
    traits = Traits("forced", switch="use_forced_text", sizing=Sizing.CAP)
    name = traits.name

    @classmethod
    def create(cls, setup: Setup) -> "ForcedTextDrafter":
        return cls(setup.tokenizer)

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer
        self._cache: dict[str, list[int]] = {}

    def propose(self, context: Sequence[int], constraint: Constraint, k: int, temperature: float,
                text: str | None = None, room: int | None = None) -> Draft:
        text = constraint.forced_text()
        if not text or k <= 0:
            return Draft([], source=self.name)
        ids = self._cache.get(text)
        if ids is None:
            ids = self._cache[text] = encode(self.tokenizer, text)
        return Draft.legal(ids[:k], constraint, self.name)  # a canonical token can overshoot what is forced
