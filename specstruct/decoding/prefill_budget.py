"""How many prompt tokens one step may prefill: a chunked-prefill budget sized from measured pass costs and the queue.

As in Sarathi-Serve and vLLM's chunked prefill (a per-pass token budget, `max_num_batched_tokens`: the decoding
rows' tokens first, prompt chunks fill the rest), but the budget is not a constant. With P rows reading their
prompt, D rows decoding that feed d tokens to this step's pass, and T(n) the measured seconds of a target pass over
n tokens (batch_policy.pass_time):

- nobody decodes (D = 0): IDLE_PREFILL tokens; nobody waits on the step, so the largest pass is the cheapest;
- otherwise the step may last at most P / D decode-only steps: b is the largest budget with

      T(d + b) <= T(d) * P / D

  so while at most as many prompts wait as rows decode (a long prompt joining running rows) the rule grants
  nothing beyond the floor (`BatchDecoder(prefill_chunk=32)`: latency first, a running row's step stays within
  ~1.5x a decode-only step on the real pair); when prompts outnumber the decoding rows (a burst of arrivals:
  throughput matters) the few decoding rows accept steps longer in proportion, and the many waiting ones start
  decoding sooner, where their tokens share passes instead of waiting behind 32-token chunks;
- never above IDLE_PREFILL, nor above PASS_TOKENS - d in all: the row invariance of the linear kernel (every
  row's result bitwise the same in any pass) is measured up to 300 rows per pass. The floor is always granted.

Chunking never changes a result (row-wise attention over each row's own KV), so the budget may depend on timing.
"""

from __future__ import annotations

from typing import Callable

IDLE_PREFILL = 256  # prefill tokens per step when no row is decoding
PASS_TOKENS = 300  # most tokens in one pass the adaptive budget fills up to (row invariance measured to 300 rows)


def prefill_budget(floor: int, prefilling: int, decoding: int, decode_tokens: int,
                   cost: Callable[[int], float]) -> int:
    """Prompt tokens the step may read in all. `floor`: the latency-first budget, always granted; `prefilling` /
    `decoding`: rows reading their prompt / decoding; `decode_tokens`: what the decoding rows feed this pass (an
    upper bound); `cost(n)`: estimated seconds (or any consistent unit) of a target pass over n tokens."""
    if decoding <= 0:
        return max(floor, IDLE_PREFILL)
    cap = min(IDLE_PREFILL, PASS_TOKENS - decode_tokens)
    if prefilling <= decoding or cap <= floor:
        return floor
    bound = cost(decode_tokens) * prefilling / decoding
    lo, hi = floor, cap  # the largest b in [floor, cap] with cost(d + b) <= bound (T grows with b)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if cost(decode_tokens + mid) <= bound:
            lo = mid
        else:
            hi = mid - 1
    return lo
