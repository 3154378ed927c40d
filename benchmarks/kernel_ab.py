"""The fixed-order Linear kernel against another version of its source, side by side in one process.

    python -m benchmarks.kernel_ab --commit 2ffaf89 [--model qwen2.5-coder-1.5b] [--ks 1,5,7,9] [--repeats 8]
    python -m benchmarks.kernel_ab --source /path/to/fixed_linear.cpp

Builds the other source (from a file, or `specstruct/runtime/csrc/fixed_linear.cpp` at a git commit) next to this
tree's kernel, packs the model once (both read the same panels), and times passes of k new tokens on a 300-token
cache, the two kernels alternating, median of `--repeats`. It also says whether their logits are bitwise equal,
as a change to the kernel's loops (not its order of sums) must keep them. `--draft` times the model as a draft
(weight-only int8). Kernel changes are measured with this, not across runs: this machine drifts by 5-25% within
an hour.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time

import torch

from benchmarks.source_at import other_kernel
from specstruct.runtime import fixed_linear
from specstruct.testing import OneSequence

SOURCE = "specstruct/runtime/csrc/fixed_linear.cpp"


def compare(model, other, ks: list[int], repeats: int) -> list[tuple[int, float, float, bool]]:
    """(k, this tree's median s, the other's median s, logits bitwise equal) per k."""

    rt = OneSequence(model)
    sides = (("this", contextlib.nullcontext), ("other", lambda: fixed_linear.running(other)))
    ids = torch.randint(0, min(rt.vocab_size, 50_000), (300,), generator=torch.Generator().manual_seed(1)).tolist()
    rt.prefill(ids)
    times: dict[tuple[str, int], list[float]] = {}
    logits: dict[tuple[str, int], torch.Tensor] = {}
    for r in range(repeats + 1):  # the first round warms up
        for side, kernel in sides:
            with kernel():  # the same packed panels, computed by one build or the other
                for k in ks:
                    t0 = time.perf_counter()
                    logits[(side, k)] = rt.extend(ids[:k])
                    if r:
                        times.setdefault((side, k), []).append(time.perf_counter() - t0)
                    rt.crop(300)
    return [(k, statistics.median(times[("this", k)]), statistics.median(times[("other", k)]),
             torch.equal(logits[("this", k)], logits[("other", k)])) for k in ks]


def main(argv: list[str] | None = None) -> None:
    from specstruct.models import load
    from specstruct.runtime.model_runtime import quantize_draft

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    which = ap.add_mutually_exclusive_group(required=True)
    which.add_argument("--commit", help=f"the other version: {SOURCE} at this git commit")
    which.add_argument("--source", help="the other version: this .cpp file")
    ap.add_argument("--model", default="qwen2.5-coder-1.5b")
    ap.add_argument("--draft", action="store_true", help="time the model as a draft (weight-only int8)")
    ap.add_argument("--ks", default="1,5,7,9", help="new tokens per pass, comma-separated")
    ap.add_argument("--repeats", type=int, default=8)
    args = ap.parse_args(argv)
    if fixed_linear.kernel() is None:
        raise SystemExit(f"this tree's kernel is not built: {fixed_linear.why_not()}")
    other = other_kernel(SOURCE, file=args.source, commit=args.commit)
    model, _ = load(args.model)
    if args.draft:
        model = quantize_draft(model)
    print(f"{args.model}{' (int8 draft)' if args.draft else ''}, {torch.get_num_threads()} threads, 300-token cache, "
          f"median of {args.repeats}, the two kernels alternating; other = {args.commit or args.source}")
    try:
        rows = compare(model, other, [int(k) for k in args.ks.split(",")], args.repeats)
    except ValueError as e:  # fixed_linear.running: another panel width
        raise SystemExit(f"{e}: their packed weights differ, compare them with forward_cost across runs instead")
    for k, ours, theirs, same in rows:
        print(f"k={k}: this tree {ours * 1e3:.1f} ms, other {theirs * 1e3:.1f} ms, {theirs / ours:.3f}x; "
              f"logits bitwise equal: {same}")


if __name__ == "__main__":
    main()
