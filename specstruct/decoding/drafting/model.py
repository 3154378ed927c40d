"""A small draft model with the target's vocabulary, proposing under the same grammar mask.

It keeps its own KV cache in step with the committed tokens: before proposing, the cache is cropped to the
longest prefix it shares with the context and extended with the rest (normally the last accepted draft token and
the target's bonus token), so nothing is recomputed that need not be.
"""

from __future__ import annotations

import time
from typing import Sequence

import torch

from ..interfaces import Constraint, Draft
from ..runtime import ModelRuntime
from ..verify import distribution, greedy_token, sample


class DraftModelDrafter:
    name = "model"

    def __init__(self, runtime: ModelRuntime, eos_token_ids: Sequence[int] = ()):
        self.runtime = runtime
        self.eos = set(eos_token_ids)
        self.tokens: list[int] = []  # what the draft cache holds
        self.generator: torch.Generator | None = None
        self.step_seconds: list[tuple[int, float]] = []  # (rows, seconds) per draft pass, for the cost model
        self.prefill_kw: dict = {}

    def reset(self, generator: torch.Generator | None = None, *, cache_salt: str | None = None,
              reuse: bool = True) -> None:
        """Start a new request: the cache is re-synced (prefilled, from the prefix cache if it can) on the first
        propose()."""
        self.tokens = []
        self.generator = generator
        self.prefill_kw = {"cache_salt": cache_salt, "reuse": reuse}

    def _sync(self, context: Sequence[int]) -> torch.Tensor:
        """Make the cache hold `context`; return the draft logits after its last token."""
        ctx = list(context)
        common = 0
        limit = min(len(ctx) - 1, len(self.tokens))  # always re-run at least the last token to get its logits
        while common < limit and self.tokens[common] == ctx[common]:
            common += 1
        t0 = time.perf_counter()
        if common == 0:
            logits = self.runtime.prefill(ctx, **self.prefill_kw)  # once per request; not a per-token cost
        else:
            self.runtime.crop(common)
            logits = self.runtime.extend(ctx[common:])[-1]
            self.step_seconds.append((len(ctx) - common, time.perf_counter() - t0))
        self.tokens = ctx
        return logits

    def propose(self, context: Sequence[int], constraint: Constraint, k: int, temperature: float) -> Draft:
        if k <= 0:
            return Draft([], source=self.name)
        logits = self._sync(context)
        tokens: list[int] = []
        qs: list[torch.Tensor] = []
        for i in range(k):
            mask = constraint.mask()
            if temperature > 0:
                q = distribution(logits[: mask.shape[0]], mask, temperature)
                t = sample(q, self.generator)
                qs.append(q)
            else:
                t = greedy_token(logits[: mask.shape[0]], mask)
            if constraint.advance([t]) != 1:
                break
            tokens.append(t)
            if t in self.eos or i == k - 1:
                break
            t0 = time.perf_counter()
            logits = self.runtime.extend([t])[-1]
            self.step_seconds.append((1, time.perf_counter() - t0))
            self.tokens.append(t)
        return Draft(tokens, q=torch.stack(qs) if qs else None, source=self.name)

    def observe(self, proposed: int, accepted: int) -> None:
        pass
