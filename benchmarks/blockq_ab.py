"""The block-quantized Linear kernel against another version of its source, side by side in one process.

    python -m benchmarks.blockq_ab --commit HEAD~1 [--format Q4_K] [--repeats 30]
    python -m benchmarks.blockq_ab --source /path/to/blockq_linear.cpp

Builds the other source (a file, or `specstruct/runtime/csrc/blockq_linear.cpp` at a git commit) next to this tree's
kernel and times both on the 1.5B target's Linear shapes (random blocks of `--format`) at 1, 9, 64 and 235 rows
(a decode step, a 9-token verification, prefill chunks), the two alternating call by call, median of `--repeats`.
It checks their outputs are bitwise equal: a change to the kernel's loops, not its order of sums, must keep them.
Kernel changes are measured with this, not across runs: this machine drifts by 5-25% within an hour.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from specstruct.runtime import native, quantized

SOURCE = "specstruct/runtime/csrc/blockq_linear.cpp"
# (outputs, inputs) of Qwen2.5-1.5B's Linear layers: k/v, q/o, gate/up, down
SHAPES = [(256, 1536), (1536, 1536), (8960, 1536), (1536, 8960)]
ROWS = [1, 9, 64, 235]


def other_kernel(source: str | None, commit: str | None):
    """Build the other version (a distinct extension name, so both load in one process)."""
    from torch.utils import cpp_extension

    if commit:
        text = subprocess.run(["git", "show", f"{commit}:{SOURCE}"], check=True, capture_output=True, text=True).stdout
        path = Path(tempfile.mkdtemp()) / "blockq_other.cpp"
        path.write_text(text)
    else:
        path = Path(source)
    name = f"specstruct_blockq_other_{native.cpu_key(path)}"
    return cpp_extension.load(name=name, sources=[str(path)], extra_cflags=native.CFLAGS,
                              extra_ldflags=native.LDFLAGS, verbose=False)


def random_weight(fmt: str, rows: int, cols: int, rng: np.random.Generator) -> quantized.QuantWeight:
    _, _, per_block, block_bytes = quantized.DECODERS[fmt]
    raw = rng.integers(0, 256, size=(rows, cols // per_block * block_bytes), dtype=np.uint8)
    blocks = raw.reshape(-1, block_bytes)
    for at in {"Q4_K": [0, 2], "Q6_K": [208]}.get(fmt, [0]):  # fp16 scales of a real model's size
        blocks[:, at : at + 2] = rng.uniform(-0.05, 0.05, len(blocks)).astype(np.float16).view(np.uint8).reshape(-1, 2)
    return quantized.from_gguf_blocks(fmt, raw, rows, cols)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--commit", help="the other kernel: blockq_linear.cpp at this git commit")
    ap.add_argument("--source", help="the other kernel: this file")
    ap.add_argument("--format", default="Q4_K", choices=list(quantized.DECODERS))
    ap.add_argument("--repeats", type=int, default=30)
    args = ap.parse_args()
    if not (args.commit or args.source):
        ap.error("give --commit or --source")
    mine, other = quantized.kernel(), other_kernel(args.source, args.commit)
    print(f"kernel: {mine.simd}; {torch.get_num_threads()} threads; format {args.format}")
    rng = np.random.default_rng(0)
    print("| outputs x inputs | rows | other, ms | this tree, ms | other / this | bitwise equal |")
    print("|---|---|---|---|---|---|")
    for n, k in SHAPES:
        w = random_weight(args.format, n, k, rng)
        f = w.fmt
        call = (w.packed, w.scales, w.mins, w.subscales, w.submins, n, f.group, f.bits, f.zero, f.gps, None)
        for m in ROWS:
            x = torch.randn(m, k)
            equal = torch.equal(mine.linear(x, *call), other.linear(x, *call))
            times: dict[str, list[float]] = {"this": [], "other": []}
            for i in range(args.repeats):
                pair = [("this", mine), ("other", other)]
                for side, ext in pair if i % 2 else pair[::-1]:
                    t0 = time.perf_counter()
                    ext.linear(x, *call)
                    times[side].append(time.perf_counter() - t0)
            a, b = statistics.median(times["other"]), statistics.median(times["this"])
            print(f"| {n} x {k} | {m} | {a * 1e3:.3f} | {b * 1e3:.3f} | {a / b:.2f}x | {'yes' if equal else 'NO'} |")


if __name__ == "__main__":
    main()
