"""The speculator (a model pair, its proposers and policy) and one request as a row.

`Speculator` owns the target runtime, the drafters and the shared policy; `speculator.row(...)` makes one request's
`Row` (row.py), which the scheduler hands to the BatchDecoder (batch.py): one decode loop, whether a batch holds one
row or many. Each step:

  1. draft    forced text, then prompt lookup, then the draft model, each on a fork of the constraint
  2. verify   one target pass over [last committed token, candidates]; accept the longest prefix the target agrees
              with, then commit the target's own next token
  3. rollback crop the target cache to what was accepted (the constraint fork is simply dropped)
  4. observe  acceptance and costs go back to the policy

With no candidates this is plain constrained decoding, one token per target pass; the output is the same either
way (greedy: token for token; sampling: in distribution).
"""

from __future__ import annotations

from typing import Any, Sequence

from specstruct.config import SpecConfig
from specstruct.runtime.kv.prefix_cache import PrefixCache
from specstruct.constraints.base import Constraint
from specstruct.spec.interfaces import Proposer, Runtime, Setup
from specstruct.spec.policy import AdaptivePolicy
from specstruct.spec.proposers.draft_model import read_seconds, step_seconds
from specstruct.spec.proposers.registry import Proposers, build
from specstruct.spec.row import Row


class Speculator:
    """Owns the target runtime, the drafters and the policy; `row` makes one request."""

    def __init__(
        self,
        target: Runtime,
        tokenizer: Any,
        eos_token_ids: Sequence[int],
        draft: Runtime | None = None,
        config: SpecConfig | None = None,
        prefix_cache: PrefixCache | None = None,
    ):
        self.target: Runtime = target
        self.prefix_cache = prefix_cache  # both models' cached prompt prefixes (namespaced by model and numerics)
        self.tokenizer = tokenizer
        self.eos = set(int(e) for e in eos_token_ids)
        self.proposers: Proposers = build(Setup(tokenizer, frozenset(self.eos), draft))  # proposers/registry.py
        self.drafters: dict[str, Proposer] = self.proposers.all()  # by name (statistics, benchmarks)
        self.policy = AdaptivePolicy(config or SpecConfig(), set(self.drafters))
        self.numerics: str = target.numerics
        if draft is not None:
            self.policy.observe_cost("draft-timed", 1, step_seconds(draft))  # the policy skips a draft that cannot pay
            self.policy.observe_cost("draft-read-timed", 32, 32 * read_seconds(draft, 32))  # and charges its reading
            self.numerics += f"; draft: {draft.numerics}"

    def row(self, prompt: Sequence[int], constraint: Constraint, config: SpecConfig) -> Row:
        """One request, ready for `BatchDecoder.add`."""
        return Row(self, list(prompt), constraint, config)
