"""The decode loop. Each step:

  1. commit   the pending token (the target's own choice from the last pass) into the constraint
  2. plan     ask the policy how many candidates each drafter may propose
  3. draft    forced text, then prompt lookup, then the draft model, each on a fork of the constraint
  4. verify   one target pass over [pending, candidates]; accept the longest prefix the target agrees with
  5. rollback crop the target cache to what was accepted (the constraint fork is simply dropped)
  6. observe  acceptance and costs go back to the policy

With no candidates this is plain constrained decoding, one token per target pass; the output is the same either
way (greedy: token for token; sampling: in distribution).
"""

from __future__ import annotations

import time
from typing import Iterator, Sequence

import torch

from specstruct.config import SpecConfig
from .drafting import DraftModelDrafter, ForcedTextDrafter, PromptLookupDrafter
from .interfaces import Constraint
from .policy import AdaptivePolicy
from specstruct.results import DrafterStats, Stats
from .runtime import ModelRuntime
from .verify import distribution, greedy_token, sample, verify_greedy, verify_sampling


class _Timed:
    """Constraint wrapper that adds the time spent computing masks to stats.mask_time_s."""

    def __init__(self, inner: Constraint, stats: Stats):
        self.inner, self.stats = inner, stats

    def mask(self) -> torch.Tensor:
        t0 = time.perf_counter()
        m = self.inner.mask()
        self.stats.mask_time_s += time.perf_counter() - t0
        return m

    def fork(self) -> "_Timed":
        return _Timed(self.inner.fork(), self.stats)

    def __getattr__(self, name):
        return getattr(self.inner, name)


class Engine:
    """Owns the target runtime, the drafters and the policy; `decode` runs one request."""

    def __init__(
        self,
        target: ModelRuntime,
        tokenizer,
        eos_token_ids: Sequence[int],
        draft: ModelRuntime | None = None,
        config: SpecConfig | None = None,
    ):
        self.target = target
        self.tokenizer = tokenizer
        self.eos = set(int(e) for e in eos_token_ids)
        self.drafters = {"forced": ForcedTextDrafter(tokenizer), "lookup": PromptLookupDrafter()}
        if draft is not None:
            self.drafters["model"] = DraftModelDrafter(draft, self.eos)
        self.policy = AdaptivePolicy(config or SpecConfig(), set(self.drafters))
        self.numerics = target.numerics
        if draft is not None:
            self.numerics += f"; draft: {getattr(draft.model, '_specstruct_draft_numerics', draft.numerics)}"

    def decode(self, prompt: Sequence[int], constraint: Constraint, config: SpecConfig) -> "Decode":
        return Decode(self, list(prompt), constraint, config)


class Decode:
    """One request. Iterate it to receive committed tokens step by step; afterwards read `token_ids`,
    `finish_reason` and `stats`."""

    def __init__(self, engine: Engine, prompt: list[int], constraint: Constraint, config: SpecConfig):
        self.engine, self.prompt, self.config = engine, prompt, config
        self.stats = Stats(mode=constraint.mode, prompt_tokens=len(prompt), numerics=engine.numerics)
        self.constraint = _Timed(constraint, self.stats)
        self.token_ids: list[int] = []
        self.finish_reason = "length"
        if config.temperature > 0 and config.seed is not None:
            # a seeded sample must not depend on timings or earlier requests: plan from this request alone
            self.policy = AdaptivePolicy(config, set(engine.drafters), use_timing=False)
        else:
            self.policy = engine.policy
            self.policy.config = config
        self.generator = torch.Generator().manual_seed(config.seed if config.seed is not None else
                                                       int(torch.randint(0, 2**62, ()).item()))

    # -- helpers ----------------------------------------------------------------------------------------------
    def _choose(self, logits: torch.Tensor, mask: torch.Tensor) -> int:
        if self.config.temperature > 0:
            return sample(distribution(logits, mask, self.config.temperature, self.config.top_p), self.generator)
        return greedy_token(logits, mask)

    def _only_eos_left(self) -> bool:
        c = self.constraint
        if not c.is_final():
            return False
        m = c.mask()
        return int(m.sum()) == sum(int(m[e]) for e in self.engine.eos if e < m.shape[0])

    def _finished(self) -> str | None:
        """'stop' when a stop string appeared, 'length' when max_new_tokens is reached, else None."""
        if self._hit_stop():
            return "stop"
        if len(self.token_ids) >= self.config.max_new_tokens:
            return "length"
        return None

    def _hit_stop(self) -> bool:
        """True when a stop string has appeared; token_ids are then trimmed to end with the token that completed
        it, exactly where one-token-at-a-time decoding would have stopped."""
        if not self.config.stop:
            return False
        decode = self.engine.tokenizer.decode
        if not any(s in decode(self.token_ids[-64:]) for s in self.config.stop):
            return False
        ids = self.token_ids
        for m in range(max(1, len(ids) - 8), len(ids) + 1):
            if any(s in decode(ids[max(0, m - 64) : m]) for s in self.config.stop):
                del ids[m:]
                break
        return True

    def _draft(self, budget: int) -> tuple[list[int], list[torch.Tensor | None], list[tuple[str, int]]]:
        """Candidates from the planned drafters, in order, on a fork of the constraint."""
        plan = self.policy.plan(self.constraint.mode)
        budget = min(budget, plan.k)
        fork = self.constraint.fork()
        context = self.prompt + self.token_ids
        cands: list[int] = []
        qs: list[torch.Tensor | None] = []
        segments: list[tuple[str, int]] = []
        t0 = time.perf_counter()
        for name in plan.drafters:
            room = min(plan.limits.get(name, 0), budget - len(cands))
            if room <= 0 or (cands and cands[-1] in self.engine.eos):
                break
            drafter = self.engine.drafters[name]
            d = drafter.propose(context + cands, fork, room, self.config.temperature)
            if d.tokens:
                cands += d.tokens
                qs += [None] * len(d.tokens) if d.q is None else list(d.q)
                segments.append((name, len(d.tokens)))
        self.stats.draft_time_s += time.perf_counter() - t0
        drafter = self.engine.drafters.get("model")
        if drafter is not None and drafter.step_seconds:
            for rows, s in drafter.step_seconds:
                self.policy.observe_cost("draft", rows, s)
            drafter.step_seconds.clear()
        return cands, qs, segments

    def _record(self, segments: list[tuple[str, int]], accepted: int) -> None:
        offset = 0
        for name, count in segments:
            got = max(0, min(count, accepted - offset))
            judged = offset <= accepted  # the target reached this drafter's first token
            offset += count
            st = self.stats.per_drafter.setdefault(name, DrafterStats())
            st.proposed += count
            st.accepted += got
            if judged:  # tokens after an earlier drafter's rejection say nothing about this drafter
                self.policy.observe(self.constraint.mode, name, count, got)
                self.engine.drafters[name].observe(count, got)

    # -- the loop ---------------------------------------------------------------------------------------------
    def __iter__(self) -> Iterator[list[int]]:
        cfg, rt, c, st = self.config, self.engine.target, self.constraint, self.stats
        eos = self.engine.eos
        self.policy.config = cfg
        model_drafter = self.engine.drafters.get("model")
        if model_drafter is not None:
            model_drafter.reset(self.generator, cache_salt=cfg.cache_salt, reuse=cfg.use_prefix_cache)
        start = time.perf_counter()
        logits = rt.prefill(self.prompt, cache_salt=cfg.cache_salt, reuse=cfg.use_prefix_cache)
        st.prefill_s = time.perf_counter() - start
        st.cached_prompt_tokens = getattr(rt, "cached_tokens", 0)
        st.target_forwards = 1
        pending = self._choose(logits, c.mask())
        try:
            while True:
                # 1. commit the pending token
                if pending in eos:
                    self.finish_reason = "stop"
                    return
                if c.advance([pending]) != 1:
                    raise RuntimeError(f"internal error: token {pending} chosen under the mask was rejected")
                self.token_ids.append(pending)
                yield [pending]
                reason = self._finished() or ("stop" if self._only_eos_left() else None)  # complete: no pass for EOS
                if reason:
                    self.finish_reason = reason
                    return
                # 2-3. plan and draft (never past max_new_tokens: the pass adds one token of its own)
                cands, qs, segments = self._draft(cfg.max_new_tokens - len(self.token_ids) - 1)
                fork = c.fork()
                masks = [fork.mask()]
                for t in cands:
                    fork.advance([t])
                    masks.append(fork.mask())
                # 4. verify in one target pass
                t0 = time.perf_counter()
                logits = rt.extend([pending] + cands)  # [k+1, V]
                dt = time.perf_counter() - t0
                st.verify_time_s += dt
                st.target_forwards += 1
                self.policy.observe_cost("target", len(cands) + 1, dt)
                if cfg.temperature > 0:
                    p = torch.stack([distribution(logits[i], masks[i], cfg.temperature, cfg.top_p)
                                     for i in range(len(cands) + 1)])
                    n, pending = verify_sampling(p, qs, cands, self.generator)
                else:
                    n, pending = verify_greedy(logits, masks, cands)
                # 5. keep what was accepted
                st.k_histogram[len(cands)] = st.k_histogram.get(len(cands), 0) + 1
                st.drafted += len(cands)
                st.accepted += n
                self._record(segments, n)
                rt.crop(len(self.prompt) + len(self.token_ids) + n)
                accepted = cands[:n]
                ends = bool(accepted) and accepted[-1] in eos  # drafted EOS accepted: the output ends here
                if ends:
                    accepted = accepted[:-1]
                if accepted:
                    c.advance(accepted)
                    self.token_ids += accepted
                    yield accepted
                reason = "stop" if ends else self._finished()
                if reason:
                    self.finish_reason = reason
                    return
        finally:
            st.new_tokens = len(self.token_ids)
            st.elapsed_s = time.perf_counter() - start

    def run(self) -> "Decode":
        for _ in self:
            pass
        return self
