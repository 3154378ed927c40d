"""The block-quantized Linear kernel against another version of its source, side by side in one process.

    python -m benchmarks.blockq_ab --commit HEAD~1 [--format Q4_K] [--repeats 30]
    python -m benchmarks.blockq_ab --source /path/to/blockq_linear.cpp
    python -m benchmarks.blockq_ab --march x86-64-v3 [--scalar]
    python -m benchmarks.blockq_ab --formats Q4_K,Q5_K,IQ4_XS [--rows 1,9]

Builds the other source (a file, or `specstruct/runtime/csrc/blockq_linear.cpp` at a git commit) next to this tree's
kernel and times both on the 1.5B target's Linear shapes (random blocks of `--format`) at 1, 9, 64 and 235 rows
(a decode step, a 9-token verification, prefill chunks), the two alternating call by call, median of `--repeats`.
`--march` builds this tree's source for another instruction set instead (x86-64-v3: AVX2 without AVX-512), and
`--scalar` times the portable path beside it. It checks their outputs are bitwise equal: a change to the kernel's
loops or its vector unit, not its order of sums, must keep them.
`--formats` times this tree's kernel on several formats instead (the same shapes, the formats alternating call by
call), with the bytes per weight each holds.
Kernel changes are measured with this, not across runs: this machine drifts by 5-25% within an hour.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

from benchmarks.source_at import other_kernel
from specstruct.runtime import quantized

SOURCE = "specstruct/runtime/csrc/blockq_linear.cpp"
# (outputs, inputs) of Qwen2.5-1.5B's Linear layers: k/v, q/o, gate/up, down
SHAPES = [(256, 1536), (1536, 1536), (8960, 1536), (1536, 8960)]
ROWS = [1, 9, 64, 235]


def random_weight(fmt: str, rows: int, cols: int, rng: np.random.Generator) -> quantized.QuantWeight:
    block = quantized.DECODERS[fmt]
    raw = rng.integers(0, 256, size=(rows, cols // block.weights * block.nbytes), dtype=np.uint8)
    blocks = raw.reshape(-1, block.nbytes)
    for at in block.halves:  # fp16 scales of a real model's size
        blocks[:, at : at + 2] = rng.uniform(-0.05, 0.05, len(blocks)).astype(np.float16).view(np.uint8).reshape(-1, 2)
    return quantized.from_gguf_blocks(fmt, raw, rows, cols)


def kernel_args(ext, w: quantized.QuantWeight) -> tuple:
    """`w`'s arguments for kernel `ext`: a kernel from before the table formats takes no table flag."""
    args = w.args()
    if hasattr(ext, "iq4nl_values"):
        return args
    if w.fmt.lut:
        raise SystemExit(f"the other kernel does not compute {w.fmt.name}")
    return args[:-1]


def compare_formats(names: list[str], rows: list[int], repeats: int) -> None:
    """This tree's kernel on each format, side by side: median ms per call, bytes per weight held."""
    mine = quantized.kernel()
    print(f"kernel: {mine.simd}; {torch.get_num_threads()} threads")
    print("| outputs x inputs | rows | " + " | ".join(f"{n}, ms" for n in names) + " |")
    print("|---|---|" + "---|" * len(names))
    rng = np.random.default_rng(0)
    held: dict[str, float] = {}
    for n, k in SHAPES:
        weights = {name: random_weight(name, n, k, rng) for name in names}
        held.update({name: w.nbytes / (n * k) for name, w in weights.items()})
        for m in rows:
            x = torch.randn(m, k)
            times: dict[str, list[float]] = {name: [] for name in names}
            for i in range(repeats):
                for name in names if i % 2 else names[::-1]:
                    t0 = time.perf_counter()
                    weights[name].linear(x)
                    times[name].append(time.perf_counter() - t0)
            print(f"| {n} x {k} | {m} | " + " | ".join(f"{statistics.median(times[name]) * 1e3:.3f}"
                                                       for name in names) + " |")
    print("bytes per weight held: " + ", ".join(f"{name} {held[name]:.3f}" for name in names))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--commit", help="the other kernel: blockq_linear.cpp at this git commit")
    ap.add_argument("--source", help="the other kernel: this file")
    ap.add_argument("--march", help="the other kernel: this tree's source built with -march=MARCH")
    ap.add_argument("--scalar", action="store_true", help="also time the portable path (linear_scalar)")
    ap.add_argument("--format", default="Q4_K", choices=list(quantized.DECODERS))
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--formats", help="comma-separated formats: time this tree's kernel on each, side by side")
    ap.add_argument("--rows", default=",".join(map(str, ROWS)), help="rows per call (comma-separated)")
    args = ap.parse_args()
    rows = [int(r) for r in args.rows.split(",")]
    if args.formats:
        names = args.formats.split(",")
        unknown = [n for n in names if n not in quantized.DECODERS]
        if unknown:
            ap.error(f"unknown formats {', '.join(unknown)} (known: {', '.join(quantized.DECODERS)})")
        compare_formats(names, rows, args.repeats)
        return
    if not (args.commit or args.source or args.march):
        ap.error("give --commit, --source or --march")
    mine = quantized.kernel()
    other = (quantized.kernel_for(args.march) if args.march
             else other_kernel(SOURCE, file=args.source, commit=args.commit))
    print(f"kernel: {mine.simd}, other: {other.simd}; {torch.get_num_threads()} threads; format {args.format}")
    rng = np.random.default_rng(0)
    scalar_head = (" scalar, ms |", "---|") if args.scalar else ("", "")
    print(f"| outputs x inputs | rows | other, ms | this tree, ms |{scalar_head[0]} other / this | bitwise equal |")
    print(f"|---|---|---|---|{scalar_head[1]}---|---|")
    for n, k in SHAPES:
        w = random_weight(args.format, n, k, rng)
        call, theirs = (*kernel_args(mine, w), None), (*kernel_args(other, w), None)
        for m in rows:
            x = torch.randn(m, k)
            equal = torch.equal(mine.linear(x, *call), other.linear(x, *theirs))
            sides = {"this": lambda: mine.linear(x, *call), "other": lambda: other.linear(x, *theirs)}
            if args.scalar:
                sides["scalar"] = lambda: mine.linear_scalar(x, *call[:-1])
            times: dict[str, list[float]] = {side: [] for side in sides}
            for i in range(args.repeats if m < 64 or not args.scalar else max(3, args.repeats // 10)):
                order = list(sides.items())
                for side, fn in order if i % 2 else order[::-1]:
                    t0 = time.perf_counter()
                    fn()
                    times[side].append(time.perf_counter() - t0)
            a, b = statistics.median(times["other"]), statistics.median(times["this"])
            c = f" {statistics.median(times['scalar']) * 1e3:.3f} |" if args.scalar else ""
            print(f"| {n} x {k} | {m} | {a * 1e3:.3f} | {b * 1e3:.3f} |{c} {a / b:.2f}x | {'yes' if equal else 'NO'} |")


if __name__ == "__main__":
    main()
