"""How many prompt tokens one step may prefill: a chunked-prefill budget sized from measured pass costs and the queue.

As in Sarathi-Serve and vLLM's chunked prefill (a per-pass token budget, `max_num_batched_tokens`: the decoding
rows' tokens first, prompt chunks fill the rest), but the budget is not a constant. With P rows reading their
prompt, D rows decoding that feed d tokens to this step's pass, and T(n) the measured seconds of a target pass over
n tokens (batch_policy.pass_time):

- nobody decodes (D = 0): IDLE_PREFILL tokens; nobody waits on the step, so the largest pass is the cheapest;
- otherwise b is the largest budget with

      D * (T(d + b) - T(d)) <= P * T(d)        i.e.   T(d + b) <= T(d) * (1 + P / D)

  the row-seconds the decoding rows lose to prefill in a step never exceed what a decode-only step would cost the
  waiting prompts. A long prompt joining several decoding rows gets little (joining 3: steps of 1 1/3 decode
  steps, under 32 tokens on the real pair, so the floor `BatchDecoder(prefill_chunk=32)` applies: latency first,
  a running row's step stays within ~1.5x); a burst of prompts with few rows decoding gets long steps (1 decoding,
  7 waiting: up to 8 decode steps, so the cap): the waiting rows start decoding sooner and share passes instead of
  queueing behind 32-token chunks. (Over a whole prefill the decoding rows absorb the same prefill compute however
  it is chunked; chunks only decide how long one step may be, and many small passes repeat the per-pass cost.)
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
    if prefilling <= 0 or cap <= floor:
        return floor
    bound = cost(decode_tokens) * (1 + prefilling / decoding)
    lo, hi = floor, cap  # the largest b in [floor, cap] with cost(d + b) <= bound (T grows with b)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if cost(decode_tokens + mid) <= bound:
            lo = mid
        else:
            hi = mid - 1
    return lo
