"""The row-wise attention in C++ against the same attention as torch ops, side by side in one process.

    python -m benchmarks.attention_ab [--model qwen2.5-coder-1.5b] [--draft] [--ks 1,9,64] [--cache 300]
                                            [--repeats 8]

Times passes of k new tokens on a `--cache`-token cache through specstruct's runtime, the two attentions
(csrc/row_attention.cpp and packed.py's torch ops) alternating pass by pass on the same model and weights, median
of `--repeats`, and prints the largest difference of their logits (not zero: a different order of sums, each
row-invariant on its own). `--draft` times the model as a draft (weight-only int8). A pass of 1 token is a decode
step, 9 a verification, 64 a prompt chunk.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from specstruct.runtime import packed
from specstruct.runtime.owned import hand_over, marks
from specstruct.testing import OneSequence

SIDES = ("cpp", "torch")


def compare(model, ks: list[int], repeats: int, cache: int) -> list[tuple[int, float, float, float]]:
    """(k, C++ median s, torch ops median s, max |logit difference|) per k."""

    hand_over(model)  # switched in place, as the engine does the models it loads (one copy of the weights)
    rt = OneSequence(model)
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, min(rt.vocab_size, 50_000), (cache + max(ks),), generator=gen).tolist()
    rt.prefill(ids[:cache])
    times: dict[tuple[str, int], list[float]] = {}
    logits: dict[tuple[str, int], torch.Tensor] = {}
    for r in range(repeats + 1):  # the first round warms up
        for side in SIDES:
            marks(rt.model).attention = side  # what packed.forward_packed reads for the runtime's model
            for k in ks:
                t0 = time.perf_counter()
                logits[(side, k)] = rt.extend(ids[cache : cache + k])
                if r:
                    times.setdefault((side, k), []).append(time.perf_counter() - t0)
                rt.crop(cache)
    marks(rt.model).attention = "cpp"
    return [(k, statistics.median(times[("cpp", k)]), statistics.median(times[("torch", k)]),
             (logits[("cpp", k)] - logits[("torch", k)]).abs().max().item()) for k in ks]


def main(argv: list[str] | None = None) -> None:
    from specstruct.runtime.model_runtime import quantize_draft
    from specstruct.models import load

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen2.5-coder-1.5b")
    ap.add_argument("--draft", action="store_true", help="time the model as a draft (weight-only int8)")
    ap.add_argument("--ks", default="1,9,64", help="new tokens per pass, comma-separated")
    ap.add_argument("--cache", type=int, default=300, help="tokens already in the cache")
    ap.add_argument("--repeats", type=int, default=8)
    args = ap.parse_args(argv)
    if packed.attention_kernel() != "cpp":
        raise SystemExit(f"the C++ attention is not built: {packed._KERNEL.error or 'SPECSTRUCT_ATTENTION=torch'}")
    model, _ = load(args.model)
    if args.draft:
        model = quantize_draft(model)
    print(f"{args.model}{' (int8 draft)' if args.draft else ''}, {torch.get_num_threads()} threads, "
          f"{args.cache}-token cache, median of {args.repeats}, the two attentions alternating")
    for k, cpp, ops, diff in compare(model, [int(k) for k in args.ks.split(",")], args.repeats, args.cache):
        print(f"k={k}: C++ {cpp * 1e3:.1f} ms, torch ops {ops * 1e3:.1f} ms, {ops / cpp:.3f}x; "
              f"max logit difference {diff:.2e}")


if __name__ == "__main__":
    main()
