"""The draft model proposing for many rows at once: one packed draft pass per draft position.

Each row keeps its own draft KV sequence. The first pass of a step syncs every drafting row's cache with its
context (crop to the longest common prefix, feed the rest: usually the last accepted token and the target's
bonus token) and yields its first draft token; each further pass feeds one token per row still drafting. A row's draft reads its prompt
only once the policy first gives it the draft model, a chunk per step (`feed_only` jobs) while the row goes on
with its free drafters: a row that never drafts with the model costs the draft nothing, not even its prompt.

Arbitration (greedy rows, `SpecConfig.draft_arbitration`): the free candidates (forced text, prompt lookup, guesses) come
as a `hint`. They go through the draft in the first pass, which syncs its cache anyway; the draft keeps the
hint's longest prefix that equals its own greedy choice under the mask and continues with its own tokens from
there. A wrong lookup span then no longer wastes every draft token chained after it (docs/benchmarks.md has
the measurement that found this).

Forced tokens inside a draft (`Job.forced`): where the constraint leaves exactly one legal token after a draft token
(JSON punctuation, the rest of a required key), that token joins the draft at once and is fed to the draft cache
in the next pass together with the draft token before it, instead of costing a draft pass of its own. The target
accepts it whatever its logits (it is the only legal choice), so this is lossless for greedy and sampling alike.
`Job.runs` records which tokens came from the model and which were forced, for the per-drafter statistics.
(Measured on the real pair: 0.61 -> 0.40 draft passes per output token, same outputs; docs/benchmarks.md.)

With row-invariant draft numerics (float32, or weight-only int8 on the fixed-order kernel, the default) a row's
draft is independent of the batch. torch.ao's dynamic int8 (the fallback where the kernel is not built) is not (its
activation scale is per tensor), which only matters for seeded sampling (the draft's distribution q enters the
accept test): with it such rows get passes of their own, fed exactly as when decoded alone.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

import torch

from specstruct.constraints.base import Constraint
from specstruct.spec.interfaces import Runtime, Sequence_, Setup, Sizing, Traits
from specstruct.spec.proposers.forced import ForcedTextDrafter
from specstruct.spec.verify import distribution, greedy_token, sample

FORCED = ForcedTextDrafter.name  # the tokens a draft appends without a draft pass count as forced text


class DraftModelDrafter:
    """The draft model among the proposers: a model-step proposer (its length is cost-gated by the policy) that
    proposes for every row of a batch at once (`propose_batch`, packed passes of its own runtime)."""

    traits = Traits("model", switch="use_draft_model", sizing=Sizing.LEARNED, model_step=True)
    name = traits.name

    @classmethod
    def create(cls, setup: Setup) -> "DraftModelDrafter | None":
        return None if setup.draft is None else cls(setup.draft, setup.eos)

    def __init__(self, runtime: Runtime, eos_token_ids: Iterable[int] = ()):
        self.runtime = runtime
        self.eos = set(eos_token_ids)

    def propose_batch(self, jobs: Sequence["Job"], costs: list[tuple[int, float]]) -> None:
        run_drafts(self.runtime, list(jobs), self.eos, costs)


def _shortest(runtime: Runtime, tokens: int, repeats: int, fresh: bool) -> float:
    """Seconds of one draft pass of `tokens` tokens, the shortest of `repeats` after one that warms up (the shortest:
    a busy moment only lengthens some); `fresh`: each pass on an empty sequence, else all on one."""
    seq = runtime.sequence()
    times = []
    for i in range(repeats + 1):
        if fresh:
            seq = runtime.sequence()
        t0 = time.perf_counter()
        runtime.forward([(seq, [0] * tokens)], [1])
        if torch.cuda.is_available():  # a GPU's kernels run asynchronously: time them, not their launch
            torch.cuda.synchronize()
        if i:
            times.append(time.perf_counter() - t0)
    return min(times)


def step_seconds(runtime: Runtime, repeats: int = 5) -> float:
    """Seconds of one one-token draft step, on a sequence of its own: the policy's draft cost before the draft has
    drafted (it decides whether a lone row tries the draft at all)."""
    return _shortest(runtime, 1, repeats, fresh=False)


def read_seconds(runtime: Runtime, tokens: int = 32, repeats: int = 3) -> float:
    """Seconds per token of the draft reading `tokens` context tokens into an empty cache: what a row's first use of
    the draft pays before its first draft token (the policy charges it to the draft's trial)."""
    return _shortest(runtime, tokens, repeats, fresh=True) / tokens


class DraftState:
    """What one row's draft cache holds."""

    def __init__(self, runtime: Runtime, layers: list[Any] | None = None, tokens: Sequence[int] = ()):
        self.kv: Sequence_ = runtime.sequence(layers, len(tokens)) if tokens else runtime.sequence()  # a cached prefix: copied
        self.tokens: list[int] = list(tokens)

    def feed_for(self, context: Sequence[int]) -> list[int]:
        """Crop to the longest prefix shared with `context` (re-running at least its last token) -> what to feed."""
        limit = min(len(context) - 1, len(self.tokens))
        common = 0
        while common < limit and self.tokens[common] == context[common]:
            common += 1
        self.kv.crop(common)
        self.tokens = list(context[:common])
        return list(context[common:])


@dataclass
class Job:
    """One row's drafting this step: its context, constraint fork, how many tokens it may draft."""

    state: DraftState
    context: list[int]
    fork: Constraint | None
    k: int
    temperature: float
    generator: torch.Generator | None
    alone: bool = False  # passes of its own (seeded sampling with a draft that is not row-invariant)
    feed_only: bool = False  # a catch-up chunk of the row's context: extend the cache, draft nothing
    hint: list[int] = field(default_factory=list)  # free candidates the draft arbitrates (greedy)
    hint_kept: int = 0
    limit: int = 0  # with a hint: the most tokens it may draft once it dropped part of the hint (their room)
    forced: bool = False  # append the tokens the constraint leaves no choice about without a draft pass
    confidence: float = 0.0  # stop after a draft token the draft model gives less than this probability (0: never)
    stopped: bool = False
    tokens: list[int] = field(default_factory=list)
    qs: list[torch.Tensor | None] = field(default_factory=list)  # when sampling: q per token (None: forced)
    runs: list[tuple[str, int]] = field(default_factory=list)  # (proposer name, count) in token order
    error: BaseException | None = None

    def legal(self) -> Constraint:
        """The constraint fork it drafts under (a feed-only job has none: it drafts nothing)."""
        if self.fork is None:
            raise RuntimeError("internal error: a feed-only draft job was asked for its constraint")
        return self.fork

    def _append(self, name: str, tokens: list[int], qs: Sequence[torch.Tensor | None]) -> None:
        self.tokens += tokens
        if self.temperature > 0:
            self.qs += list(qs)
        if self.runs and self.runs[-1][0] == name:
            self.runs[-1] = (name, self.runs[-1][1] + len(tokens))
        else:
            self.runs.append((name, len(tokens)))


def _groups(jobs: list[Job]) -> list[list[Job]]:
    shared = [j for j in jobs if not j.alone]
    return ([shared] if shared else []) + [[j] for j in jobs if j.alone]


def run_drafts(runtime: Runtime, jobs: list[Job], eos: set[int], costs: list[tuple[int, float]]) -> None:
    """Fill each job's tokens (and q when sampling). Appends (rows, seconds) of each one-token pass to `costs`."""
    feeds = {id(j): (j.context if j.feed_only else j.state.feed_for(j.context) + j.hint) for j in jobs}
    live = [j for j in jobs if feeds[id(j)] and (j.feed_only or j.k > 0 or j.hint)]
    first = True
    while live:
        more = []
        for group in _groups(live):
            t0 = time.perf_counter()
            logits = runtime.forward([(j.state.kv, feeds[id(j)]) for j in group],
                                     [0 if j.feed_only else (1 + len(j.hint) if first else 1) for j in group])
            if not first:  # the first pass syncs caches (ragged feeds): not a per-token step cost
                costs.append((len(group), time.perf_counter() - t0))
            for j, lg in zip(group, logits):
                j.state.tokens += feeds[id(j)]
                at = -1
                if first and j.hint:
                    at = _arbitrate(j, lg)
                if (not j.feed_only and len(j.tokens) < j.k and _take(j, lg[at]) and j.tokens[-1] not in eos
                        and not j.stopped):
                    feeds[id(j)] = [j.tokens[-1]] + _forced(j, eos)  # nothing forced once the draft is full
                    if len(j.tokens) < j.k:
                        more.append(j)
        first = False
        live = more


def _arbitrate(job: Job, logits: torch.Tensor) -> int:
    """Keep the hint's prefix the draft would choose itself (advancing the fork over it), forget the rest from the
    draft cache; returns the row of `logits` to draft the next own token from."""
    kept = 0
    try:
        for i, x in enumerate(job.hint):
            mask = job.legal().mask()
            if greedy_token(logits[i, : mask.shape[0]], mask) != x or job.legal().advance([x]) != 1:
                break
            kept += 1
    except Exception as err:  # a broken constraint fails its own row only
        job.error = err
    job.hint_kept = kept
    job.k = min(job.k + len(job.hint) - kept, max(job.k, job.limit))  # the dropped hint's room is the draft's
    length = len(job.state.tokens) - len(job.hint) + kept
    job.state.kv.crop(length)
    del job.state.tokens[length:]
    return kept


def _take(job: Job, logits: torch.Tensor) -> bool:
    """Append the next draft token chosen under the fork's mask; False when the constraint refuses it."""
    try:
        mask = job.legal().mask()
        if job.temperature > 0:
            q = distribution(logits[: mask.shape[0]], mask, job.temperature)
            t = sample(q, job.generator)
        else:
            q, t = None, greedy_token(logits[: mask.shape[0]], mask)
        if job.legal().advance([t]) != 1:
            return False
        if job.confidence > 0:  # the draft doubts this token: verify what it has rather than draft on
            p = q[t] if q is not None else _probability(logits[: mask.shape[0]], mask, t)
            job.stopped = bool(p < job.confidence)
    except Exception as err:  # a broken constraint fails its own row only
        job.error = err
        return False
    job._append(DraftModelDrafter.name, [t], [q])
    return True


def _probability(logits: torch.Tensor, mask: torch.Tensor, t: int) -> float:
    """The draft's probability of token t under the mask (temperature 1)."""
    masked = logits.float().masked_fill(~mask, float("-inf"))
    return float(torch.exp(masked[t] - torch.logsumexp(masked, dim=0)))


def _forced(job: Job, eos: set[int]) -> list[int]:
    """Tokens that are the only legal choice after the last draft token, appended to the draft (fork advanced)."""
    ids: list[int] = []
    try:
        while job.forced and len(job.tokens) + len(ids) < job.k:
            allowed = job.legal().mask().nonzero()
            if allowed.shape[0] != 1 or int(allowed[0]) in eos or job.legal().advance([int(allowed[0])]) != 1:
                break
            ids.append(int(allowed[0]))
    except Exception as err:  # a broken constraint fails its own row only
        job.error = err
    if ids:
        job._append(FORCED, ids, [None] * len(ids))
    return ids
