"""Prompt lookup: extraction copies spans of its input, so when the last few generated tokens also occur earlier
in the context, propose what followed them there (Saxena 2023, "prompt lookup decoding"), filtered by the
constraint."""

from __future__ import annotations

from typing import Sequence

from specstruct.spec.interfaces import Constraint, Draft


class PromptLookupDrafter:
    name = "lookup"

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1):
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram

    def propose(self, context: Sequence[int], constraint: Constraint, k: int, temperature: float) -> Draft:
        ctx = list(context)
        for n in range(self.max_ngram, self.min_ngram - 1, -1):
            if len(ctx) <= n:
                continue
            suffix = ctx[-n:]
            # the most recent earlier occurrence of the suffix, continuation taken from after it
            for start in range(len(ctx) - n - 1, -1, -1):
                if ctx[start : start + n] == suffix:
                    cont = ctx[start + n : start + n + k]
                    m = constraint.advance(cont)
                    if m:
                        return Draft(cont[:m], source=self.name)
                    break  # the freshest match is illegal here; shorter n-grams may still help
        return Draft([], source=self.name)
