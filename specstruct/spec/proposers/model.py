"""The draft model among the drafters: a small model with the target's vocabulary.

It drafts for every row of a batch at once in spec/proposers/draft_model.py: each row's draft cache is synced with its
context, greedy rows arbitrate the free candidates (forced text, prompt lookup: kept only as far as the draft
agrees; measured in docs/benchmarks.md), and packed passes propose under each row's grammar mask. This object
names the draft for the policy and holds its runtime.
"""

from __future__ import annotations

from typing import Sequence

from specstruct.runtime.model_runtime import ModelRuntime


class DraftModelDrafter:
    name = "model"

    def __init__(self, runtime: ModelRuntime, eos_token_ids: Sequence[int] = ()):
        self.runtime = runtime
        self.eos = set(eos_token_ids)
