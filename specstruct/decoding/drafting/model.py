"""A small draft model with the target's vocabulary, proposing under the same grammar mask: the single-sequence
Drafter (the `Drafter` Protocol, for a custom loop or a tool such as bench/draft_agreement.py). The engine's own
loop drafts for all rows at once in decoding/draft_batch.py, by the same rules (cache sync, arbitration); the
engine keeps this object for its runtime and its place among the drafters.

It keeps its own KV cache in step with the committed tokens: before proposing, the cache is cropped to the
longest prefix it shares with the context and extended with the rest (normally the last accepted draft token and
the target's bonus token), so nothing is recomputed that need not be.

Arbitration (greedy): the free drafters' candidates (forced text, prompt lookup) can be passed as a `hint`. They
go through the draft in the same pass that syncs its cache, and the draft keeps the longest prefix of the hint
that matches its own greedy choice under the mask, then continues with its own tokens. Measured on the real
Qwen pair (docs/benchmarks.md), every draft token proposed on the target's path equalled the draft's
teacher-forced choice; its rejections were all tokens chained after a wrong lookup span. Checking the hint with
the draft keeps those spans from wasting the draft's tokens.
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
        self.hint_kept = 0  # how many hint tokens the last propose() kept

    def reset(self, generator: torch.Generator | None = None) -> None:
        """Start a new request: the cache is re-synced (prefilled) on the first propose()."""
        self.tokens = []
        self.generator = generator

    def _sync(self, context: Sequence[int], hint: Sequence[int] = ()) -> torch.Tensor:
        """Make the cache hold `context + hint`; return the draft logits after the last context token and after
        each hint token, shape [1 + len(hint), vocab]."""
        ctx = list(context)
        full = ctx + list(hint)
        common = 0
        limit = min(len(ctx) - 1, len(self.tokens))  # always re-run at least the last context token
        while common < limit and self.tokens[common] == ctx[common]:
            common += 1
        t0 = time.perf_counter()
        if common == 0:
            logits = self.runtime.prefill(ctx)[None]  # once per request; not a per-token cost
            if hint:
                logits = torch.cat([logits, self.runtime.extend(list(hint))])
        else:
            self.runtime.crop(common)
            logits = self.runtime.extend(full[common:])[len(ctx) - common - 1 :]
            self.step_seconds.append((len(full) - common, time.perf_counter() - t0))
        self.tokens = full
        return logits

    def _check_hint(self, logits: torch.Tensor, hint: Sequence[int], constraint: Constraint) -> int:
        """Keep the hint's longest prefix the draft itself would choose; advance the constraint over it."""
        kept = 0
        for i, x in enumerate(hint):
            mask = constraint.mask()
            if greedy_token(logits[i, : mask.shape[0]], mask) != x or constraint.advance([x]) != 1:
                break
            kept += 1
            if x in self.eos:
                break
        return kept

    def propose(self, context: Sequence[int], constraint: Constraint, k: int, temperature: float,
                hint: Sequence[int] = (), total: int | None = None) -> Draft:
        """Up to k of the draft's own tokens. With a `hint` (greedy only), first the hint's prefix the draft
        agrees with (`hint_kept` tokens, returned first in the Draft), at most `total` tokens in all."""
        hint = list(hint) if temperature <= 0 else []
        self.hint_kept = 0
        if k <= 0 and not hint:
            return Draft([], source=self.name)
        all_logits = self._sync(context, hint)
        kept = self._check_hint(all_logits, hint, constraint) if hint else 0
        self.hint_kept = kept
        if kept < len(hint):  # forget the hint tokens the draft overruled
            self.runtime.crop(len(context) + kept)
            self.tokens = self.tokens[: len(context) + kept]
        tokens: list[int] = list(hint[:kept])
        qs: list[torch.Tensor] = []
        logits = all_logits[kept]
        k = min(k, (total if total is not None else k + kept) - kept)
        if k <= 0 or (tokens and tokens[-1] in self.eos):
            return Draft(tokens, source=self.name)
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
