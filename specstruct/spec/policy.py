"""The candidate policy: how many tokens each drafter may propose at the next step.

Reads the output mode (long drafts for JSON, code and grammars; short ones for free text), the acceptance history
per mode and drafter (moving averages; a copying drafter's first token also per request: RowRates), and the
measured costs: a target pass over r rows, T(r), and a draft-model step, c * T(1). With acceptance a and k drafted
tokens a step yields on average E(k) = (1 - a^(k+1)) / (1 - a) tokens for k * c * T(1) + T(k+1) seconds, against
T(1) per token without drafting. The draft model is only used
when the best k beats k = 0; free drafters (forced text, prompt lookup, guesses) cost only the extra verification rows.

A copying proposer (prompt lookup, the suffix index) is judged differently: its first token is a guess (did the text
written last recur where the output copies from?) and the tokens after an accepted first one are a copy, right far
more often. It keeps two rates per proposer, the first token's p and the copy's a, and proposes the k that maximises (1 + p * E(a, k - 1)) / (T(k+1)/T(1)):
with verification rows nearly free, a copy runs to the cap unless its guesses almost never land.

That model leaves out what the free drafters would have proposed anyway and the draft's own reading of the prompt,
so the draft model must also beat them as measured: per output mode, the seconds per output token of a lone row's
steps with the draft model (its prompt reading included) and without it (free drafters only). The free drafters run
first (ARM_TOKENS tokens), then the draft model as long, then whichever was faster; the other is tried again every
PROBE_ARM_EVERY steps. A lone row tries the draft model only where the cost model expects it to pay. If a step of
the free drafters gives t0 tokens in P0 seconds (both measured, s0 = P0 / t0) and k draft steps appended to it add
d accepted tokens for k * e seconds (e: a draft step plus one more row in the pass), the draft pays only if
(t0 + d) / (P0 + k * e) > t0 / P0. With d = E(a, k) - 1 at the draft's acceptance a (measured, else the engine's
adaptive_threshold) the draft is tried only when the best k in 1..cap promises TRIAL_GAIN over the free drafters:
the trial costs the draft's reading of the prompt and steps at a loss where it does not pay, so a marginal promise
is not worth it (prose, where a 0.5B draft costs half a 1.5B step, promises 9% at a = 0.7 and 10% from a = 0.72).
The trial's first step also makes the row's draft read the context it lacks (R seconds: the tokens times a read's
per-token cost, timed when the engine was built), and a trial that stops after one step (the draft measured slower
than timed) has paid R for nothing: so R is charged to the trial's ARM_TOKENS output tokens, the promise being
(t0 + d) / (P0 + k * e + R * (t0 + d) / ARM_TOKENS). A probe of a draft the arms switched off is one step, which
cannot repay a read either: it waits for a row whose draft cache is in step with it.
With d <= k (a = 1) the test is the bound d / k > e / s0: where the free drafters spend at most e per token no
acceptance makes the draft pay. Forced tokens a draft appends without a draft step can break d <= k, so a verdict
both arms measured overrides it. (On a CPU with block-quantized weights a 0.5B
draft step costs about half a 1.5B one: on JSON and code, where forced text and prompt lookup give 3-5 tokens a
pass, the draft model measured slower, forced tokens included; docs/benchmarks.md.)
"""

from __future__ import annotations

from collections import defaultdict
from typing import Iterable

from specstruct.config import SpecConfig
from specstruct.constraints.base import Mode
from specstruct.spec.interfaces import Plan, Sizing, Traits
from specstruct.spec.proposers.registry import TRAITS

EMA = 0.3  # weight of the newest observation in the moving averages
PRIOR_VERIFY_SLOPE = 0.07  # prior T(r)/T(1) - 1 per extra row (oneDNN float32 on 2 AVX2 cores)
PRIOR_DRAFT_COST = 0.4  # prior draft/target step-cost ratio (0.5B vs 1.5B Qwen)
PRIOR_LOOKUP = (0.5, 0.8)  # prompt lookup's rates before any are measured: its first token, the copy after it
GROW = 2  # draft length added after a step whose draft was accepted whole
PROBE_EVERY = 16  # steps between single-token probes of a drafter the cost model switched off
ARM_TOKENS = 24  # output tokens measured with and without the draft model before the policy compares them
ARM_DECAY = 0.95  # weight of the older steps in the seconds-per-token sums of each arm
ARM_GAIN = 1.02  # the draft model must be this much faster than the free drafters alone
PROBE_ARM_EVERY = 256  # steps between tries of the arm left out: a cold draft's prompt costs ~10 target steps
TRIAL_GAIN = 1.1  # the expected gain over the free drafters that a lone row's first try of the draft model needs
PROBE_UNREAD = 2  # context tokens a probing draft may read first (the last accepted and the bonus token)
PROBE_COLD_EVERY = 8 * PROBE_ARM_EVERY  # steps after which a probe reads a cold context anyway (a slow verdict may
# come from a moment of load: without this, lone rows that start cold would never give the draft another chance)
PRIOR_READ = 0.1  # prior seconds for the draft to read one context token, as a share of one draft step
ROW_WEIGHT = 0.5  # weight of a row's newest verdict in its own first-token rate of a copying proposer (RowRates)


def expected_tokens(a: float, k: int) -> float:
    """Expected tokens per step with k drafts accepted independently with probability a (bonus token included)."""
    if a >= 1.0:
        return float(k + 1)
    return (1.0 - a ** (k + 1)) / (1.0 - a)


def _sizing(name: str) -> Sizing:
    t = TRAITS.get(name)
    return Sizing.LEARNED if t is None else t.sizing


def _ema(old: float | None, new: float) -> float:
    return new if old is None else (1 - EMA) * old + EMA * new


class RowRates:
    """One row's own first-token rates of its copying proposers, which size its copies (`AdaptivePolicy.plan`).

    The mode's rates mix every request's steps. An agent's "auto" turn (free text under a grammar that also admits a
    tool call) shares the grammar mode with its "required" turns, where the suffix index's guesses land; on the
    free text they miss step after step, each miss a pass over rows the target rejects. A row's rate starts from
    the mode's and moves by ROW_WEIGHT per verdict, so a copy that keeps missing stops for that row after a few
    steps, and a row whose copies land keeps planning them whatever the mode's rate says (in a batch, trimming
    values them at the row's rate too: `candidate_rates`). A copy the row's rate switched off is probed
    every PROBE_EVERY of the row's own steps (a count of the row's: the mode's is reset by every batched pass in
    which another row's copy was judged), so a turn that moves from free text into a tool call gets its copies back
    after its next probe lands."""

    def __init__(self) -> None:
        self.first: dict[str, float] = {}
        self.idle: dict[str, int] = defaultdict(int)  # the row's steps since its last probe of a switched-off copy
        self.probing: set[str] = set()  # the copies this row's current plan probes

    def length(self, drafter: str, k: int) -> int:
        """This row's copy length of `drafter`, `k` as its own rate sizes it: where that is 0 (switched off), 1 every
        PROBE_EVERY of the row's steps (a probe), else 0."""
        if not k:
            self.idle[drafter] += 1
        if k or self.idle[drafter] < PROBE_EVERY:
            self.probing.discard(drafter)
            return k
        self.idle[drafter] = 0
        self.probing.add(drafter)
        return 1

    def rate(self, drafter: str, mode_rate: float) -> float:
        """The first-token rate this row's copies of `drafter` are valued at in a batch (`candidate_rates`): its own,
        but the mode's for a probe (valued at the low rate that switched the copy off, every batch would trim it and
        the row's rate could never recover)."""
        return mode_rate if drafter in self.probing else self.first.get(drafter, mode_rate)

    def observe(self, policy: AdaptivePolicy, mode: Mode, drafter: str, accepted: int) -> None:
        """A judged step of `drafter` (a copying one; others are ignored): whether its first token was accepted."""
        if _sizing(drafter) is not Sizing.COPY:
            return
        old = self.first.get(drafter)
        if old is None:
            old = policy.lookup_rates(mode, drafter)[0]
        self.first[drafter] = (1 - ROW_WEIGHT) * old + ROW_WEIGHT * float(accepted > 0)


class AdaptivePolicy:
    """Mode caps, acceptance-driven growth around `adaptive_threshold`, and a cost gate for the draft model.

    One policy is shared by an engine's requests (what it learns: acceptance, costs); each request plans and learns
    with its own config, passed to `plan` and `observe` (the engine's `config` when none is given)."""

    def __init__(self, config: SpecConfig, available: Iterable[str], use_timing: bool = True):
        self.config = config  # the engine's: used by calls that pass none
        self.use_timing = use_timing  # False: plans depend only on acceptance, so seeded sampling reproduces
        names = set(available)
        self.available: list[Traits] = [t for t in TRAITS.values() if t.name in names]  # in order
        # the model-step proposer the cost model weighs (its name keys its rate), if one is available
        self.model: str | None = next((t.name for t in self.available if t.model_step), None)
        self.k: dict[tuple[Mode, str], int] = {}
        self.rate: dict[tuple[Mode, str], float | None] = defaultdict(lambda: None)
        self.target_cost: dict[int, float] = {}  # rows -> EMA seconds of one target pass
        self.draft_cost: float | None = None  # EMA seconds of one draft-model step
        self.draft_step: float | None = None  # seconds of one draft step timed when the engine was built
        self.draft_read: float | None = None  # seconds per context token of a draft reading a prompt, timed so too
        self.idle_steps: dict[tuple[Mode, str], int] = defaultdict(int)
        # (mode, proposer) -> a copying proposer's (first-token, copy) rates (prompt lookup, the suffix index)
        self.lookup: dict[tuple[Mode, str], tuple[float, float]] = {}
        # (mode, with the draft model) -> decayed (seconds, output tokens, steps) of a lone row's steps
        self.arms: dict[tuple[Mode, bool], tuple[float, float, float]] = {}
        self.arm_tokens: dict[tuple[Mode, bool], int] = defaultdict(int)
        self.arm_idle: dict[Mode, int] = defaultdict(int)

    # -- planning ---------------------------------------------------------------------------------------------
    def plan(self, mode: Mode, config: SpecConfig | None = None, alone: bool = True, unread: int = 0,
             own: RowRates | None = None) -> Plan:
        """What each drafter may propose at a row's next step; `alone`: the row has the pass to itself (the arms
        are measured on such steps; in a batch the batch policy weighs the draft model by its costs); `unread`: the
        context tokens the row's draft cache lacks (what using the draft model now would make it read first);
        `own`: the row's own first-token rates of copying proposers, which size its copies (RowRates)."""
        cfg = config or self.config
        cap = cfg.cap(mode)
        if not cfg.enable_speculative or cap <= 0:
            return Plan(k=0)
        limits: dict[str, int] = {}
        for t in self.available:
            if not getattr(cfg, t.switch):
                continue
            limits[t.name] = cap if t.sizing is Sizing.CAP else self._limit(mode, t, cap, cfg, alone, unread, own)
        drafters = [t.name for t in self.available if limits.get(t.name, 0) > 0]
        return Plan(k=cap, drafters=drafters, limits=limits)

    def _limit(self, mode: Mode, t: Traits, cap: int, cfg: SpecConfig, alone: bool = True, unread: int = 0,
               own: RowRates | None = None) -> int:
        key = (mode, t.name)
        if t.sizing is Sizing.COPY and own is not None:  # the row's own rate, and its own probes where it is off
            return own.length(t.name, self.lookup_k(mode, cap, t.name, own.first.get(t.name)))
        if t.sizing is Sizing.COPY:
            best = self.lookup_k(mode, cap, t.name)
        else:
            k = self.k.setdefault(key, max(0, min(cfg.initial_candidates, cap)))
            if t.model_step and self.use_timing and not self._model_arm(mode, alone, unread):
                return 0
            if not t.model_step or k == 0 or not self.costs_measured():
                return k  # until costs are measured, start from initial_candidates and adapt on acceptance alone
            best = self.best_k(mode, k, cfg.adaptive_threshold)
        if best == 0:
            self.idle_steps[key] += 1
            if self.idle_steps[key] >= PROBE_EVERY:  # re-measure acceptance now and then
                self.idle_steps[key] = 0
                return 1
        return best

    def best_k(self, mode: Mode, k_max: int, threshold: float | None = None) -> int:
        """The draft length in 0..k_max that maximises expected tokens per second (acceptance `threshold`, by
        default the engine's, until one is measured)."""
        a = self.model_rate(mode)
        if a is None:
            a = self.config.adaptive_threshold if threshold is None else threshold
        c = self.cost_ratio()
        best, best_rate = 0, 1.0  # k = 0: one token per T(1)
        for k in range(1, k_max + 1):
            rate = expected_tokens(a, k) / (k * c + self.verify_ratio(k + 1))
            if rate > best_rate * 1.02:  # ask for a clear gain, not noise
                best, best_rate = k, rate
        return best

    def model_rate(self, mode: Mode) -> float | None:
        """The model-step proposer's measured acceptance rate in `mode` (None before it was measured)."""
        return self.rate[(mode, self.model)] if self.model is not None else None

    def candidate_rates(self, mode: Mode, segments: Iterable[tuple[str, int]], default: float,
                        own: RowRates | None = None) -> list[float]:
        """Per candidate of a step (`segments`: (proposer, count) in order), its proposer's acceptance rate as
        measured (`default` before it was): a copy's first token is a guess, the rest a copy (lookup_rates); with
        `own`, the guess is valued at the row's own first-token rate, as `plan` sized it (a probe at the mode's:
        RowRates.rate)."""
        out: list[float] = []
        for name, count in segments:
            if _sizing(name) is Sizing.COPY:
                first, copy = self.lookup_rates(mode, name)
                if own is not None:
                    first = own.rate(name, first)
                out += [first] + [copy] * (count - 1)
                continue
            rate = self.rate[(mode, name)]
            out += [default if rate is None else rate] * count
        return out

    def lookup_rates(self, mode: Mode, name: str) -> tuple[float, float]:
        """A copying proposer's (first-token, copy) acceptance rates in `mode`: measured, else PRIOR_LOOKUP."""
        return self.lookup.get((mode, name), PRIOR_LOOKUP)

    def lookup_k(self, mode: Mode, k_max: int, name: str, own_first: float | None = None) -> int:
        """A copying proposer's length in 0..k_max that maximises expected tokens per unit of pass time (`own_first`:
        a row's own first-token rate, in place of the mode's)."""
        p, a = self.lookup_rates(mode, name)
        if own_first is not None:
            p = own_first
        best, best_rate = 0, 1.0
        for k in range(1, k_max + 1):
            rate = (1.0 + p * expected_tokens(a, k - 1)) / self.verify_ratio(k + 1)
            if rate > best_rate * 1.02:
                best, best_rate = k, rate
        return best

    def model_verdict(self, mode: Mode, unread: int = 0) -> str:
        """"explore-without" / "explore-with" (an arm still measures its first ARM_TOKENS), "on" or "off"; `unread`:
        the context a row's draft would read first (trial_gain charges it)."""
        if self.arm_tokens[(mode, False)] < ARM_TOKENS:
            return "explore-without"
        if self.arm_tokens[(mode, True)] >= ARM_TOKENS:  # both measured: the measurement decides
            (s1, t1, _), (s0, t0, _) = self.arms[(mode, True)], self.arms[(mode, False)]
            return "on" if s1 / t1 * ARM_GAIN < s0 / t0 else "off"
        return "explore-with" if self.trial_gain(mode, unread=unread) >= TRIAL_GAIN else "off"

    def trial_gain(self, mode: Mode, cap: int | None = None, rate: float | None = None, unread: int = 0) -> float:
        """The most a draft of 1..cap tokens (the mode's cap) at acceptance `rate` (the draft's measured rate, else
        the engine's adaptive_threshold) is expected to speed a lone row's steps up over the free drafters alone in
        `mode`, as measured (module docstring), its reading of `unread` context tokens charged to the trial's
        ARM_TOKENS output tokens; inf before anything is measured (no basis to rule the draft out)."""
        step = self.draft_cost if self.draft_cost is not None else self.draft_step
        if step is None or (mode, False) not in self.arms:
            return float("inf")
        s0, t0, n0 = self.arms[(mode, False)]
        if s0 <= 0 or n0 <= 0:
            return float("inf")
        seconds, tokens = s0 / n0, t0 / n0  # a step of the free drafters: P0 and t0
        t1 = self.t1() or 0.0
        e = step + t1 * (self.verify_ratio(9) - 1.0) / 8  # a draft token: a draft step and one more row in the pass
        read = unread * self.read_cost()  # the draft's cold reading, paid before its first token
        a = rate if rate is not None else self.model_rate(mode)
        a = self.config.adaptive_threshold if a is None else a
        best = 0.0
        for k in range(1, max(1, self.config.cap(mode) if cap is None else cap) + 1):
            gives = tokens + expected_tokens(a, k) - 1.0
            costs = seconds + k * e + read * gives / ARM_TOKENS  # the read, spread over the trial's steps
            best = max(best, gives / costs * seconds / tokens)
        return best

    def read_cost(self) -> float:
        """Seconds for the draft to read one context token: timed when the engine was built, else PRIOR_READ of a
        draft step (0 before a draft step is known)."""
        if self.draft_read is not None:
            return self.draft_read
        step = self.draft_cost if self.draft_cost is not None else self.draft_step
        return 0.0 if step is None else PRIOR_READ * step

    def _model_arm(self, mode: Mode, alone: bool = True, unread: int = 0) -> bool:
        """Whether this step of a row in `mode` may use the draft model (the arm the verdict chose, or a probe)."""
        if not alone:  # a batch: the batch policy sizes the draft by its costs, where lone rows do not rule it out
            return self.model_verdict(mode) != "off"  # (measured, or by the cost model: a batch's rows do not make
        verdict = self.model_verdict(mode, unread)  # the draft cheaper)
        if verdict.startswith("explore"):
            return verdict == "explore-with"
        if self.arm_tokens[(mode, True)] < ARM_TOKENS:  # off without a trial (trial_gain): no probe either
            return False
        self.arm_idle[mode] = min(self.arm_idle[mode] + 1, PROBE_COLD_EVERY)
        # a probe of the draft waits for a row whose draft has nothing to read (one step cannot repay a cold read),
        # or, at the longest, PROBE_COLD_EVERY steps
        idle = self.arm_idle[mode]
        probe = idle >= PROBE_COLD_EVERY or (idle >= PROBE_ARM_EVERY and (verdict == "on" or unread <= PROBE_UNREAD))
        if probe:
            self.arm_idle[mode] = 0
        return (verdict == "on") != probe

    def observe_step(self, mode: Mode, with_model: bool, tokens: int, seconds: float) -> None:
        """A lone row's step: the output tokens it gave and its seconds (the draft model's, prompt reading included)."""
        if not self.use_timing or tokens <= 0:
            return
        key = (mode, with_model)
        s, t, n = self.arms.get(key, (0.0, 0.0, 0.0))
        self.arms[key] = (s * ARM_DECAY + seconds, t * ARM_DECAY + tokens, n * ARM_DECAY + 1.0)
        self.arm_tokens[key] += tokens

    def t1(self) -> float | None:
        """Seconds of a one-token target pass: measured, or inferred from the narrowest measured pass."""
        if 1 in self.target_cost:
            return self.target_cost[1]
        if not self.target_cost:
            return None
        rows = min(self.target_cost)
        return self.target_cost[rows] / (1.0 + PRIOR_VERIFY_SLOPE * (rows - 1))

    def verify_ratio(self, rows: int) -> float:
        """T(rows) / T(1), measured where possible, else from the prior slope."""
        t1 = self.t1()
        if t1 and rows in self.target_cost:
            return self.target_cost[rows] / t1
        return 1.0 + PRIOR_VERIFY_SLOPE * (rows - 1)

    def costs_measured(self) -> bool:
        return bool(self.target_cost) and self.draft_cost is not None

    def cost_ratio(self) -> float:
        t1 = self.t1()
        if t1 and self.draft_cost is not None:
            return self.draft_cost / t1
        return PRIOR_DRAFT_COST

    # -- learning ---------------------------------------------------------------------------------------------
    def observe(self, mode: Mode, drafter: str, proposed: int, accepted: int, config: SpecConfig | None = None) -> None:
        """One step's verdict on a drafter's tokens: of the `proposed` the target judged (those it accepted and the
        first it rejected; a row passes exactly those), `accepted` were accepted. Their ratio, averaged, is the
        conditional per-token rate a of E(a, k): the chance that the next token is accepted given that the ones
        before it were (accepted / all proposed would count tokens after a rejection as failures and read a long
        draft's 0.9 as about 0.6). Grow the drafter's length while it stays above the threshold, shrink below."""
        if proposed <= 0:
            return
        sizing = _sizing(drafter)
        if sizing is Sizing.COPY:  # a guess, then a copy: two rates (lookup_k)
            p, a = self.lookup_rates(mode, drafter)
            p = _ema(p, float(accepted > 0))
            if accepted and proposed > 1:
                a = _ema(a, (accepted - 1) / (proposed - 1))
            self.lookup[(mode, drafter)] = (p, a)
            return
        cfg = config or self.config
        key = (mode, drafter)
        # the average starts from the threshold, not from the first observation: one unlucky first step (a draft
        # judged on 3 tokens, 1 accepted) must not switch the draft model off for PROBE_EVERY steps
        prior = self.rate[key] if self.rate[key] is not None else cfg.adaptive_threshold
        rate = _ema(prior, accepted / proposed)
        self.rate[key] = rate
        if sizing is Sizing.CAP:
            return
        cap = cfg.cap(mode)
        k = self.k.get(key, cfg.initial_candidates)
        if rate >= cfg.adaptive_threshold and accepted == proposed:
            k = min(cap, k + GROW)  # all accepted: grow fast (transformers' assisted generation adds 2 too)
        elif rate < cfg.adaptive_threshold:
            k = max(1, k - 1)
        self.k[key] = k

    def observe_cost(self, kind: str, rows: int, seconds: float) -> None:
        if not self.use_timing:
            return
        if kind == "target":
            self.target_cost[rows] = _ema(self.target_cost.get(rows), seconds)
        elif kind == "draft" and rows <= 2:  # a draft step feeds one or two tokens; longer syncs are not steps
            self.draft_cost = _ema(self.draft_cost, seconds)
        elif kind == "draft-timed":  # timed apart from decoding (Speculator): only whether to try the draft at all
            self.draft_step = seconds
        elif kind == "draft-read-timed" and rows > 0:  # a cold read of `rows` tokens, timed so too
            self.draft_read = seconds / rows
