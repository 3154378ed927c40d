"""One decode step: transformers' stock path against specstruct's runtime, alternating in one process.

    python -m benchmarks.step_ab [--model qwen2.5-coder-1.5b] [--cache 300] [--repeats 12]

Two copies of the model. One runs as transformers' `generate` runs a decode step: stock Linear layers, SDPA
attention, a DynamicCache, one new token, the last position's logits. The other is switched to specstruct's
row-invariant runtime (the fixed-order kernel, the row-wise attention), as the engine runs a step with speculation
off. Each round times one step of each on the same `--cache`-token context (then crops both caches back), so the
machine's drift hits both alike; prints the medians and their ratio. The goal: specstruct's step no slower.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from specstruct.testing import OneSequence


def stock_forward(model, cache, ids: list[int], cache_arg: str) -> torch.Tensor:
    """A forward as transformers' generate runs it (the cache grows by `ids`): the last position's logits."""
    out = model(input_ids=torch.tensor([ids]), use_cache=True, logits_to_keep=1, **{cache_arg: cache})
    return out.logits[0, -1]


@torch.inference_mode()
def compare(stock, ours, cache_len: int, repeats: int) -> tuple[float, float, float]:
    """(stock median s, specstruct median s, max |logit difference| of the last step)."""
    from transformers import DynamicCache

    from specstruct.runtime.model_runtime import cache_kwarg
    from specstruct.runtime.owned import hand_over

    hand_over(ours)  # switched in place (its own copy of the weights, loaded for it)
    rt, cache_arg = OneSequence(ours), cache_kwarg(stock)  # looked up once, outside the timed steps
    gen = torch.Generator().manual_seed(2)
    ids = torch.randint(0, min(rt.vocab_size, 50_000), (cache_len + 1,), generator=gen).tolist()
    cache = DynamicCache(config=stock.config)
    stock_forward(stock, cache, ids[:cache_len], cache_arg)
    rt.prefill(ids[:cache_len])
    times: dict[str, list[float]] = {"stock": [], "specstruct": []}
    for r in range(repeats + 1):  # the first round warms up
        t0 = time.perf_counter()
        a = stock_forward(stock, cache, ids[cache_len:], cache_arg)
        t1 = time.perf_counter()
        b = rt.extend(ids[cache_len:], last_only=True)[-1]
        t2 = time.perf_counter()
        cache.crop(-1)  # a negative count removes from the end (transformers 4.x and 5.x)
        rt.crop(cache_len)
        if r:
            times["stock"].append(t1 - t0)
            times["specstruct"].append(t2 - t1)
    return statistics.median(times["stock"]), statistics.median(times["specstruct"]), (a - b).abs().max().item()


def main(argv: list[str] | None = None) -> None:
    from specstruct.models import load

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen2.5-coder-1.5b")
    ap.add_argument("--cache", type=int, default=300, help="tokens already in the cache")
    ap.add_argument("--repeats", type=int, default=12)
    args = ap.parse_args(argv)
    stock, _ = load(args.model)
    ours, _ = load(args.model)  # a second copy: the runtime packs its weights in place
    stock.config._attn_implementation = "sdpa"
    s, o, diff = compare(stock.eval(), ours, args.cache, args.repeats)
    print(f"{args.model}, {torch.get_num_threads()} threads, {args.cache}-token cache, median of {args.repeats}, "
          f"alternating: transformers stock step {s * 1e3:.1f} ms, specstruct step {o * 1e3:.1f} ms, "
          f"stock / specstruct = {s / o:.3f}x; max logit difference {diff:.2e}")


if __name__ == "__main__":
    main()
