"""One request's decoding state, as a row of a batch: its constraint, KV sequences, drafting and acceptance.

A row goes through: prefill (its prompt, in chunks) -> commit the target's first choice -> steps of
[free drafts, model drafts, one verify segment, accept]. The batch (batch.py) owns the passes; the row owns
everything that is per request: constraint state, policy and acceptance history, generator, stats.
"""

from __future__ import annotations

import time
from typing import Any, Protocol, Sequence, cast

import torch

from specstruct.config import SpecConfig
from specstruct.constraints.base import Constraint, Mode, bitmask_words, fill_bitmasks, finished, write_bitmask
from specstruct.errors import ConstraintError
from specstruct.results import DrafterStats, Stats
from specstruct.spec.interfaces import Plan, Proposal, Proposer, Sequence_, TenantDrafter
from specstruct.spec.policy import AdaptivePolicy, RowRates
from specstruct.spec.proposers.draft_model import DraftState
from specstruct.spec.proposers.registry import Proposers
from specstruct.spec.stops import IncrementalText, StopScanner
from specstruct.spec.verify import distribution, greedy_token, sample, verify_greedy, verify_sampling


class SpeculatorLike(Protocol):
    """What a row reads of the Speculator that made it (speculator.py, which imports this module)."""

    tokenizer: Any
    eos: set[int]
    numerics: str
    proposers: Proposers
    drafters: dict[str, Proposer]
    policy: AdaptivePolicy


class _Timed:
    """Constraint wrapper that adds the time spent computing masks to stats.mask_time_s."""

    def __init__(self, inner: Constraint, stats: Stats):
        self.inner, self.stats = inner, stats
        self.mode: Mode = inner.mode
        self.vocab_size: int = inner.vocab_size

    def advance(self, tokens: Sequence[int]) -> int:
        return self.inner.advance(tokens)

    def rollback(self, n: int) -> None:
        self.inner.rollback(n)

    def forced_text(self) -> str:
        return self.inner.forced_text()

    def is_final(self) -> bool:
        return self.inner.is_final()

    def accepts(self, text: str) -> bool:
        return self.inner.accepts(text)

    def mask(self) -> torch.Tensor:
        t0 = time.perf_counter()
        m = self.inner.mask()
        self.stats.mask_time_s += time.perf_counter() - t0
        return m

    def fill_bitmask(self, out: torch.Tensor) -> None:
        t0 = time.perf_counter()
        write_bitmask(self.inner, out)
        self.stats.mask_time_s += time.perf_counter() - t0

    def fork(self) -> "_Timed":
        return _Timed(self.inner.fork(), self.stats)

    def __getattr__(self, name: str) -> Any:  # a backend's own extras (a JSON schema's `keys`)
        return getattr(self.inner, name)


def generator_seed(seed: int) -> int:
    """torch's CPU generator keeps the low 32 bits of its seed, so 0, 2**32 and 2**63 gave the same samples. Seeds
    in [0, 2**32) are used as given (seeded outputs stay as they were); others are mixed (splitmix64) first."""
    if 0 <= seed < 2**32:
        return seed
    z = (seed + 0x9E3779B97F4A7C15) & (2**64 - 1)
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & (2**64 - 1)
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & (2**64 - 1)
    return (z ^ (z >> 31)) & (2**32 - 1)


class Row:
    """One request. After it finished read `token_ids`, `finish_reason` ("stop", "length" or "error"), `error`
    (the exception that failed it, else None) and `stats`."""

    def __init__(self, speculator: SpeculatorLike, prompt: list[int], constraint: Constraint, config: SpecConfig):
        self.speculator, self.prompt, self.config = speculator, prompt, config
        self.stats = Stats(mode=constraint.mode, prompt_tokens=len(prompt), numerics=speculator.numerics)
        self.constraint = _Timed(constraint, self.stats)
        self.token_ids: list[int] = []
        self._stops: StopScanner | None = None  # made at the first stop check
        self._text: IncrementalText | None = None  # prompt + committed tokens as text, made when a drafter reads it
        self.finish_reason = "length"
        self.error: BaseException | None = None
        self.finished = False
        self.seeded = config.temperature > 0 and config.seed is not None
        # the engine's policy (what it learned), planned and taught with this request's config; a seeded sample must
        # not depend on timings, earlier requests or the batch: it plans from this request alone
        self.policy = AdaptivePolicy(config, set(speculator.drafters), use_timing=False) if self.seeded else speculator.policy
        self.rates = RowRates()  # this request's own copy rates (its free text may not copy as the mode's rows do)
        self.generator = torch.Generator().manual_seed(generator_seed(config.seed) if config.seed is not None else
                                                       int(torch.randint(0, 2**62, ()).item()))
        self.kv: Sequence_ | None = None  # the target KV sequence, made on admission
        self.draft_kv: DraftState | None = None  # the draft model's, when one drafts for this row
        self.prefilled = 0  # positions in the target cache (prefill and, after a lost spill, its re-prefill)
        self.fill_to = len(prompt)  # positions to prefill before decoding (more to re-prefill committed tokens)
        self.started = self.last_pass = 0.0
        self.passes = self.rows_seen = 0

    # -- helpers ----------------------------------------------------------------------------------------------
    @property
    def target_kv(self) -> Sequence_:
        """The target KV sequence of an admitted row."""
        if self.kv is None:
            raise RuntimeError("internal error: the row has no KV sequence (not admitted, paused or removed)")
        return self.kv

    def draft_unread(self) -> int:
        """The context tokens the row's draft cache lacks (it may hold a prefix): what drafting now reads first."""
        d = self.draft_kv
        return max(0, len(self.prompt) + len(self.token_ids) - len(d.tokens)) if d is not None else 0

    def _plan(self, alone: bool = True) -> Plan:
        return self.policy.plan(self.constraint.mode, self.config, alone, unread=self.draft_unread(), own=self.rates)

    @staticmethod
    def _live(mask: torch.Tensor) -> None:
        if not bool(mask.any()):  # argmax over an all-false mask would pick token 0 as if it were legal
            raise ConstraintError("the constraint reached a state where no token is legal (not even EOS): its "
                                  "language has a dead end here; check the grammar, regex or schema.")

    def _choose(self, logits: torch.Tensor, mask: torch.Tensor) -> int:
        self._live(mask)
        if self.config.temperature > 0:
            return sample(distribution(logits, mask, self.config.temperature, self.config.top_p), self.generator)
        return greedy_token(logits, mask)

    def _only_eos_left(self) -> bool:
        c = self.constraint
        if not c.is_final():
            return False
        words = torch.empty(bitmask_words(c.vocab_size), dtype=torch.int32)
        c.fill_bitmask(words)
        raw = words.view(torch.uint8)  # the words' little-endian bytes: token t is bit t % 8 of byte t // 8
        for e in self.speculator.eos:  # what is left once the EOS bits are cleared
            if 0 <= e < c.vocab_size:
                raw[e // 8] &= 0xFF ^ (1 << (e % 8))
        return not bool(words.any())

    def _limit_reached(self) -> str | None:
        """'stop' when a stop string appeared, 'length' when max_new_tokens is reached, else None."""
        if self._hit_stop():
            return "stop"
        if len(self.token_ids) >= self.config.max_new_tokens:
            return "length"
        return None

    def _hit_stop(self) -> bool:
        """True when a stop string (code mode: the closing fence) has appeared; token_ids are then trimmed to
        end with the token that completed it, exactly where one-token-at-a-time decoding would have stopped."""
        code = self.constraint.mode == "code"
        if not self.config.stop and not code:
            return False
        if self._stops is None:  # searches only the new text each time: linear in the output, not quadratic
            decode = lambda ids: self.speculator.tokenizer.decode(ids, skip_special_tokens=True)  # noqa: E731
            self._stops = StopScanner(decode, self.config.stop, code_fence=code)
        n = self._stops.push(self.token_ids[len(self._stops.ends):])
        if n is None:
            return False
        del self.token_ids[n:]
        return True

    def finish(self, reason: str, error: BaseException | None = None) -> None:
        self.finished, self.finish_reason = True, reason
        if error is not None:
            self.error = error
        self.stats.new_tokens = len(self.token_ids)
        self.stats.elapsed_s = time.perf_counter() - self.started
        self.stats.batch_rows = self.rows_seen / self.passes if self.passes else 0.0
        if reason != "error" and self.config.enable_speculative:  # its tenant's per-tenant proposers learn it
            self.speculator.proposers.remember(self.config, self.config.cache_salt, self.prompt + self.token_ids)

    def complete(self) -> bool:
        """For a row max_new_tokens stopped: whether its constraint takes the output as a whole value (final,
        nothing but the end legal). True for a row that ended otherwise (a stop string's cut is checked on the
        text, api/output.py)."""
        if self.finish_reason != "length":
            return True
        try:
            return finished(self.constraint, self.speculator.eos)
        except Exception:  # a constraint that failed cannot vouch for anything
            return False

    def saw_pass(self, rows: int, seconds: float) -> None:
        self.passes += 1
        self.rows_seen += rows
        self.stats.target_forwards += 1

    # -- prefill ----------------------------------------------------------------------------------------------
    @property
    def prefilling(self) -> bool:
        return self.prefilled < self.fill_to

    def prefill_chunk(self, limit: int) -> list[int]:
        ids = self.prompt if self.fill_to <= len(self.prompt) else self.prompt + self.token_ids
        return ids[self.prefilled : min(self.prefilled + limit, self.fill_to)]

    def after_prefill(self, logits: torch.Tensor) -> list[int]:
        """The target's first choice after the prompt, committed."""
        self.stats.prefill_s = time.perf_counter() - self.started
        return self.commit(self._choose(logits, self.constraint.mask()))

    # -- one decode step --------------------------------------------------------------------------------------
    def commit(self, token: int) -> list[int]:
        """Commit the target's own choice (not yet in the KV cache); returns what was committed."""
        if token in self.speculator.eos:
            self.finish("stop")
            return []
        if self.constraint.advance([token]) != 1:
            self._live(self.constraint.mask())  # a dead end raises here
            raise RuntimeError(f"internal error: token {token} chosen under the mask was rejected")
        self.token_ids.append(token)
        reason = self._limit_reached() or ("stop" if self._only_eos_left() else None)  # complete: no pass for EOS
        if reason:
            self.finish(reason)
        return [token]

    def draft_free(self, alone: bool = True) -> "Step":
        """Plan, then draft with the zero-cost drafters (forced text, prompt lookup, guesses) on a fork of the constraint;
        `alone`: the row has this pass to itself."""
        plan = self._plan(alone)
        budget = min(self.config.max_new_tokens - len(self.token_ids) - 1, plan.k)  # the pass adds one token
        batched = self.speculator.proposers.batched  # the model-step proposer: the batch runs it after these
        model = plan.limits.get(batched.name, 0) if batched is not None and batched.name in plan.drafters else 0
        step = Step(self.constraint.fork(), budget, model)
        context = self.prompt + self.token_ids
        t0 = time.perf_counter()
        for name in plan.drafters:
            room = min(plan.limits.get(name, 0), budget - len(step.cands))
            drafter = self.speculator.proposers.free.get(name)
            if drafter is None or room <= 0 or (step.cands and step.cands[-1] in self.speculator.eos):
                break
            if drafter.traits.per_tenant and self.seeded:  # what it proposes depends on earlier requests, and a
                continue  # seeded sample's accept draws on its candidates: the same seed must give the same output
            text = self._context_text(step.cands) if drafter.traits.reads_text else None
            args = (context + step.cands, step.fork, room, self.config.temperature, text, budget - len(step.cands))
            d = (cast(TenantDrafter, drafter).propose(*args, tenant=self.config.cache_salt)  # its tenant's index only
                 if drafter.traits.per_tenant else drafter.propose(*args))
            step.add(name, d.tokens, d.q)
        step.model_room = max(0, min(step.model_room, budget - len(step.cands)))
        if step.cands and step.cands[-1] in self.speculator.eos:
            step.model_room = 0
        self.stats.draft_time_s += time.perf_counter() - t0
        return step

    def _context_text(self, candidates: list[int]) -> str:
        """The prompt, the committed tokens and `candidates` as text. The committed part is decoded incrementally
        (each token a bounded number of times, however long the output), the last few and the candidates with it."""
        if self._text is None:
            self._text = IncrementalText(self.speculator.tokenizer.decode)
            self._text.push(self.prompt)
        done = len(self._text.ids) - len(self.prompt)
        if done < len(self.token_ids):
            self._text.push(self.token_ids[done:])
        return self._text.peek(candidates)

    def masks(self, step: "Step") -> torch.Tensor:
        """The bitmask words of every position the pass verifies, in one buffer (int32 [len(cands) + 1, W]): the
        committed state's, then after each candidate. The row's own constraint walks the candidates and is rolled
        back."""
        out = torch.empty(len(step.cands) + 1, bitmask_words(self.constraint.vocab_size), dtype=torch.int32)
        fill_bitmasks(self.constraint, step.cands, out)
        return out

    def verify(self, step: Proposal, logits: torch.Tensor, masks: list[torch.Tensor]) -> list[int]:
        """Accept the longest agreed prefix of the candidates, then commit the target's next token."""
        cfg, st, cands = self.config, self.stats, list(step.tokens)
        if cfg.temperature > 0:
            p = torch.stack([distribution(logits[i], masks[i], cfg.temperature, cfg.top_p)
                             for i in range(len(cands) + 1)])
            n, pending = verify_sampling(p, list(step.qs), cands, self.generator)
        else:
            n, pending = verify_greedy(logits, masks, cands)
        st.k_histogram[len(cands)] = st.k_histogram.get(len(cands), 0) + 1
        st.drafted += len(cands)
        st.accepted += n
        self._record(list(step.segments), n)
        self.target_kv.crop(len(self.prompt) + len(self.token_ids) + n)
        accepted = cands[:n]
        ends = bool(accepted) and accepted[-1] in self.speculator.eos  # drafted EOS accepted: the output ends here
        if ends:
            accepted = accepted[:-1]
        if accepted:
            self.constraint.advance(accepted)
            self.token_ids += accepted
        reason = "stop" if ends else self._limit_reached()
        if reason:
            self.finish(reason)
            return accepted
        return accepted + self.commit(pending)

    def _record(self, segments: list[tuple[str, int]], accepted: int) -> None:
        offset = 0
        for name, count in segments:
            got = max(0, min(count, accepted - offset))
            judged = offset <= accepted  # the target reached this drafter's first token
            seen = min(count, accepted - offset + 1)  # accepted ones plus the first rejected one
            offset += count
            if judged:  # tokens after an earlier drafter's rejection say nothing about this drafter
                st = self.stats.per_drafter.setdefault(name, DrafterStats())
                st.proposed += seen
                st.judged += seen
                st.accepted += got
                # the row's rate first: it starts from the mode's before this verdict moves that
                self.rates.observe(self.policy, self.constraint.mode, name, got)
                self.policy.observe(self.constraint.mode, name, seen, got, self.config)


class Step:
    """A row's candidates for one pass: tokens, their drafters' distributions, which drafter made which."""

    def __init__(self, fork: Constraint, budget: int, model_room: int):
        self.fork, self.budget, self.model_room = fork, budget, model_room
        self.model_limit = model_room  # the policy's draft-model length, before free candidates took room
        self.cands: list[int] = []
        self.qs: list[torch.Tensor | None] = []
        self.segments: list[tuple[str, int]] = []

    def arbitrates(self, config: SpecConfig) -> bool:
        """The draft model arbitrates the free candidates (greedy, planned, switched on)."""
        return bool(self.cands) and self.model_limit > 0 and config.temperature <= 0 and config.draft_arbitration

    def keep_free(self, kept: int, fork: Constraint, stats: Stats) -> None:
        """After draft arbitration: keep only the first `kept` free candidates (the draft overruled the rest, which
        are counted per drafter); `fork` is the constraint positioned after what the draft proposes."""
        offset = 0
        for name, count in self.segments:
            dropped = count - max(0, min(count, kept - offset))
            if dropped:
                stats.per_drafter.setdefault(name, DrafterStats()).overruled += dropped
            offset += count
        self.trim(kept, fork)

    def trim(self, kept: int, fork: Constraint) -> None:
        """Keep only the first `kept` candidates; `fork` is the constraint positioned after what is kept (or after
        what the draft model goes on to propose from there)."""
        offset, segments = 0, []
        for name, count in self.segments:
            keep = max(0, min(count, kept - offset))
            if keep:
                segments.append((name, keep))
            offset += count
        if kept < len(self.cands):
            self.cands, self.qs, self.segments = self.cands[:kept], self.qs[:kept], segments
        self.fork = fork

    def proposal(self) -> Proposal:
        """What was proposed, frozen for the step plan."""
        return Proposal(tuple(self.cands), tuple(self.qs), tuple(self.segments))

    def add_runs(self, tokens: list[int], runs: list[tuple[str, int]], qs: list[torch.Tensor | None]) -> None:
        """The draft model's tokens and the forced tokens between them, in order (`qs`: q per token if sampling,
        None for a forced one)."""
        at = 0
        for name, n in runs:
            self._extend(name, tokens[at : at + n], qs[at : at + n] if qs else [None] * n)
            at += n

    def add(self, name: str, tokens: list[int], q: torch.Tensor | None) -> None:
        self._extend(name, tokens, [None] * len(tokens) if q is None else list(q))

    def _extend(self, name: str, tokens: list[int], qs: list[torch.Tensor | None]) -> None:
        if tokens:
            self.cands += tokens
            self.qs += qs
            self.segments.append((name, len(tokens)))
