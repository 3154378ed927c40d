"""Batch-aware draft lengths: choose each row's draft-model k to maximise the batch's expected tokens per second.

Rows of a pass are not free on a CPU. With rows i drafting k_i tokens (accepted with probability a_i) a step
yields sum_i E(a_i, k_i) tokens (E from policy.py: bonus token included) and costs one target pass over
R = sum_i (1 + free_i + k_i) rows plus max_i k_i draft passes, the j-th over the rows still drafting:

    goodput(k) = sum_i E(a_i, k_i) / (T(R) + sum_j D(#{i: k_i > j}))

T(rows) is the engine's measured target pass time (interpolated between measured row counts, the prior slope
beyond them), D(rows) the measured draft step. k = 0 for every row is plain batched decoding, so the chosen
lengths are never expected to be slower than it. A lone row keeps the single-request policy's k (today's long
drafts); rows whose plans must not depend on timing (seeded sampling) keep theirs and only count as load.
"""

from __future__ import annotations

from dataclasses import dataclass

from specstruct.constraints.base import Mode
from specstruct.spec.policy import PRIOR_DRAFT_COST, PRIOR_VERIFY_SLOPE, PROBE_EVERY, AdaptivePolicy, expected_tokens

GAIN = 1.02  # a longer draft must promise a clear gain, not noise


@dataclass
class Demand:
    base_rows: int  # 1 + free candidates already drafted
    limit: int  # the row's own policy limit for the draft model
    rate: float  # its draft acceptance rate
    fixed: bool = False  # keeps k = limit (seeded sampling)


def pass_time(policy: AdaptivePolicy, rows: int) -> float:
    """Estimated seconds of a target pass over `rows` rows (relative units before anything was measured)."""
    measured = sorted(policy.target_cost.items())
    if not measured:
        return 1.0 + PRIOR_VERIFY_SLOPE * (rows - 1)
    lo = [(r, t) for r, t in measured if r <= rows]
    hi = [(r, t) for r, t in measured if r >= rows]
    if lo and hi:
        (r0, t0), (r1, t1) = lo[-1], hi[0]
        return t0 if r1 == r0 else t0 + (t1 - t0) * (rows - r0) / (r1 - r0)
    r0, t0 = lo[-1] if lo else hi[0]
    t1_est = t0 / (1.0 + PRIOR_VERIFY_SLOPE * (r0 - 1))
    return t0 + t1_est * PRIOR_VERIFY_SLOPE * (rows - r0)


def draft_time(policy: AdaptivePolicy, rows: int) -> float:
    """Estimated seconds of one draft pass over `rows` rows."""
    one = policy.draft_cost
    if one is None:
        one = PRIOR_DRAFT_COST * pass_time(policy, 1)
    return one * (1.0 + PRIOR_VERIFY_SLOPE * (rows - 1))


def goodput(policy: AdaptivePolicy, demands: list[Demand], ks: list[int]) -> float:
    tokens = sum(expected_tokens(d.rate, k) for d, k in zip(demands, ks))
    rows = sum(d.base_rows + k for d, k in zip(demands, ks))
    drafting = sum(draft_time(policy, sum(1 for k in ks if k > j)) for j in range(max(ks, default=0)))
    return tokens / (pass_time(policy, rows) + drafting)


def free_lengths(policy: AdaptivePolicy, chains: list[list[float]], fixed: list[bool]) -> list[int]:
    """How many of each row's free candidates (forced text, prompt lookup, guesses) a batched pass should verify.

    `chains[i]` holds, per candidate of row i in order, its drafter's acceptance rate; the j-th candidate is worth
    the product of the rates up to it (it counts only if every one before it is accepted), and each costs one row
    of the pass. In a pass of several rows the pass is compute-bound and a row is no longer free, so candidates are
    added best first while the batch's expected tokens per second grow: goodput = (R + sum of the kept values) /
    T(R + kept). Rows whose plans must not depend on timing (`fixed`: seeded sampling) keep all theirs."""
    n = [len(c) if f else 0 for c, f in zip(chains, fixed)]
    worth: list[list[float]] = [[] for _ in chains]
    for i, chain in enumerate(chains):
        v = 1.0
        for a in chain:
            v *= a
            worth[i].append(v)
    rows = len(chains)
    tokens = rows + sum(sum(w[: k]) for w, k in zip(worth, n))
    best = tokens / pass_time(policy, rows + sum(n))
    while True:
        open_rows = [i for i in range(rows) if n[i] < len(chains[i])]
        if not open_rows:
            return n
        i = max(open_rows, key=lambda r: worth[r][n[r]])
        added = tokens + worth[i][n[i]]
        g = added / pass_time(policy, rows + sum(n) + 1)
        if g <= best:
            return n
        n[i] += 1
        tokens, best = added, g


def probe_trimmed(policy: AdaptivePolicy, rows: list[tuple[Mode, list[tuple[str, int]], int]]) -> list[int]:
    """Each row's kept length (from free_lengths), one row's raised by a probe: a drafter whose candidates every
    batched pass trims away would never be judged again, so its acceptance rate could never recover. Its row steps
    without a judged candidate are counted, as a lone row's steps are (a pass in which any row judged one resets the
    count: its rate was measured); every PROBE_EVERY of them the first row that trimmed it verifies its first
    candidate anyway (the candidates before it too: a candidate counts only after them), as the policy probes a
    draft model it switched off. `rows` are (mode, segments, kept) of the rows taught by `policy`."""
    kept = [n for _, _, n in rows]
    judged: set[tuple[Mode, str]] = set()
    trimmed: dict[tuple[Mode, str], list[tuple[int, int]]] = {}
    for i, (mode, segments, n) in enumerate(rows):
        offset = 0
        for name, count in segments:
            if offset >= n:  # the drafters after it are judged only after it
                trimmed.setdefault((mode, name), []).append((i, offset))
                break
            judged.add((mode, name))
            offset += count
    for key in judged:
        policy.idle_steps[key] = 0
    for key, where in trimmed.items():
        if key in judged:
            continue
        policy.idle_steps[key] += len(where)
        if policy.idle_steps[key] >= PROBE_EVERY:  # one probe a pass; the steps beyond it count toward the next
            policy.idle_steps[key] = min(policy.idle_steps[key] - PROBE_EVERY, PROBE_EVERY - 1)
            i, offset = where[0]
            kept[i] = offset + 1
    return kept


def allocate(policy: AdaptivePolicy, demands: list[Demand]) -> list[int]:
    """Each row's draft-model k (0..limit), raised greedily while the batch's goodput clearly improves. A move
    raises one row to some k, or every row to at least k (a draft pass is shared: it may pay only for many)."""
    if len(demands) <= 1:
        return [d.limit for d in demands]
    ks = [d.limit if d.fixed else 0 for d in demands]
    best = goodput(policy, demands, ks)
    top = max((d.limit for d in demands), default=0)
    while True:
        moves = [[max(k, min(d.limit, level)) if not d.fixed else k for d, k in zip(demands, ks)]
                 for level in range(1, top + 1)]
        moves += [ks[:i] + [k] + ks[i + 1 :] for i, d in enumerate(demands) if not d.fixed
                  for k in range(ks[i] + 1, d.limit + 1)]
        scored = [(goodput(policy, demands, m), m) for m in moves if m != ks]
        g, move = max(scored, key=lambda x: x[0], default=(0.0, ks))
        if g <= best * GAIN:
            return ks
        best, ks = g, move
