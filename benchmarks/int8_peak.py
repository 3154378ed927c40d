"""This CPU's int8 multiply-add peak on all threads, and the share of it the block-quantized Linear kernel reaches.

    python -m benchmarks.int8_peak [--rows 1,9,64,256,1024] [--format Q4_K] [--repeats 5] [--seconds 0.5] [--amx-ab]

The peak: every thread runs a register-resident loop of independent accumulator chains of one int8 dot-product
instruction (benchmarks/csrc/int8_peak.cpp): `vpdpbusd` on zmm registers (AVX-512 VNNI, 64 u8 x s8 products per
instruction), else on ymm (AVX-VNNI, 32), else `vpmaddubsw + vpmaddwd + vpaddd` (AVX2, 32 per three instructions).
Every path this build has is measured; the best is the peak. It is built with -march=native, as the runtime's kernels
are (specstruct/runtime/native.py), on first use.

The kernel: `QuantLinear` (specstruct/runtime/quantized.py) on random blocks of `--format` in the 1.5B target's Linear
shapes (k/v, q/o, gate/up, down), at each row count, median of `--repeats`; its rate is rows x outputs x inputs
multiply-adds per second, and "one layer" weighs the shapes as a layer of the 1.5B uses them (q, k, v, o, gate, up,
down). The kernel also de-quantizes and converts activations, so 100% is out of reach on the vector units; the share
says how far off the integer units it runs. Where AMX is granted, 64 rows and more run on AMX tiles, whose own rate is
above this peak (the share is still against the vector units' peak). The machine is shared: run it twice, and read the spread.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from specstruct.runtime import native, quantized

SOURCE = Path(__file__).resolve().parent / "csrc" / "int8_peak.cpp"
# (outputs, inputs) of Qwen2.5-1.5B's Linear layers, and how many of each one layer holds
SHAPES = {"k/v": (256, 1536), "q/o": (1536, 1536), "gate/up": (8960, 1536), "down": (1536, 8960)}
PER_LAYER = {"k/v": 2, "q/o": 2, "gate/up": 2, "down": 1}
ROWS = [1, 9, 64, 256, 1024]
FEATURES = ("avx512f", "avx512_vnni", "avx_vnni", "avx2", "amx_int8", "amx_tile")
NO_PATH = ("this CPU has neither AVX-512 VNNI, AVX-VNNI nor AVX2 (or the compiler did not enable them with "
           "-march=native): the probe measures x86 int8 dot-product units and has nothing to run here")


def cpu_features() -> list[str]:
    """The int8-relevant flags /proc/cpuinfo lists for this CPU (AMX listed is not AMX granted by the OS)."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = set(next((line for line in f if line.startswith("flags")), "").split(":", 1)[-1].split())
    except OSError:
        return []
    return [name for name in FEATURES if name in flags]


def probe():
    """The built probe extension; SystemExit saying why where it cannot be built or has no path."""
    kernel = native.Kernel("specstruct_int8_peak", SOURCE, "the int8 peak probe", "", march="native")
    ext = kernel.load()
    if ext is None:
        raise SystemExit(kernel.error)
    if not ext.isas():
        raise SystemExit(NO_PATH)
    return ext


def peak(ext, isa: str, threads: int, seconds: float) -> tuple[float, float]:
    """(multiply-adds per second on `threads` threads, on one thread): the best of three timed runs, each sized to
    last about `seconds`."""
    def rate(n_threads: int) -> float:
        iters = 1 << 16
        while True:  # grow until one run is long enough to time
            wall, products, _ = ext.run(isa, iters, n_threads)
            if wall >= seconds / 4:
                break
            iters *= 4
        iters = max(1, int(iters * seconds / wall))
        return max(products / wall for wall, products, _ in (ext.run(isa, iters, n_threads) for _ in range(3)))

    return rate(threads), rate(1)


def random_layer(fmt: str, n: int, k: int, rng: np.random.Generator) -> quantized.QuantLinear:
    """A QuantLinear on random GGUF blocks of `fmt` with scales of a real model's size."""
    block = quantized.DECODERS[fmt]
    raw = rng.integers(0, 256, size=(n, k // block.weights * block.nbytes), dtype=np.uint8)
    blocks = raw.reshape(-1, block.nbytes)
    for at in block.halves:
        blocks[:, at : at + 2] = rng.uniform(-0.05, 0.05, len(blocks)).astype(np.float16).view(np.uint8).reshape(-1, 2)
    return quantized.QuantLinear(quantized.from_gguf_blocks(fmt, raw, n, k))


def kernel_seconds(layer: quantized.QuantLinear, rows: int, repeats: int) -> float:
    x = torch.randn(rows, layer.in_features)
    with torch.inference_mode():
        layer(x)  # untimed: first-call work
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            layer(x)
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def amx_pair_seconds(layer: quantized.QuantLinear, rows: int, repeats: int) -> tuple[float, float]:
    """(median seconds with AMX tiles, without), the two alternating call by call (the same noise on both)."""
    x = torch.randn(rows, layer.in_features)
    ext = quantized.kernel()
    times: dict[bool, list[float]] = {True: [], False: []}
    with torch.inference_mode():
        try:
            for i in range(2 * repeats + 2):
                on = i % 2 == 0
                ext.use_amx(on)
                t0 = time.perf_counter()
                layer(x)
                if i >= 2:  # the first call of each: untimed
                    times[on].append(time.perf_counter() - t0)
        finally:
            ext.use_amx(True)
    return statistics.median(times[True]), statistics.median(times[False])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default=",".join(map(str, ROWS)), help="comma-separated row counts")
    ap.add_argument("--format", default="Q4_K", choices=list(quantized.DECODERS))
    ap.add_argument("--repeats", type=int, default=5, help="timed calls per shape and row count (median)")
    ap.add_argument("--seconds", type=float, default=0.5, help="length of one peak run")
    ap.add_argument("--peak-only", action="store_true", help="measure the peak, not the kernel")
    ap.add_argument("--amx-ab", action="store_true", help="where AMX is granted: also time each shape without the "
                    "tiles (the vector path), the two alternating call by call, and print the ratio")
    args = ap.parse_args()
    rows = [int(r) for r in args.rows.split(",") if r.strip()]
    threads = torch.get_num_threads()

    ext = probe()
    print(f"CPU: {_cpu_name()}; {os.cpu_count()} logical CPUs, {threads} threads (torch.get_num_threads())")
    load = os.getloadavg()[0]
    if load > (os.cpu_count() or 1) * 0.75:
        print(f"WARNING: load average {load:.1f} on {os.cpu_count()} CPUs: other work shares them, so a thread of an "
              "all-thread run waits for a CPU; the peak and the kernel's times are low and noisy (a share above "
              "100% is that noise). Measure on an idle machine.")
    print(f"int8 features listed: {', '.join(cpu_features()) or 'none'}; probe paths built: {', '.join(ext.isas())}")
    rates = {isa: peak(ext, isa, threads, args.seconds) for isa in ext.isas()}
    for isa, (all_threads, one) in rates.items():
        print(f"  {isa:12s} {all_threads / 1e9:8.1f} G int8 multiply-adds/s on {threads} threads "
              f"({one / 1e9:.1f} G on one)")
    best_isa = max(rates, key=lambda isa: rates[isa][0])
    best = rates[best_isa][0]
    print(f"peak: {best / 1e12:.3f} T int8 multiply-adds/s ({best_isa})")
    if args.peak_only:
        return

    tiles = ", AMX tiles from 64 rows" if quantized.amx() else ""
    print(f"\nblock-quantized kernel ({quantized.simd()}{tiles}), {args.format} random blocks, median of {args.repeats}:")
    ab = args.amx_ab and quantized.amx()
    print("| shape (outputs x inputs) | rows | ms | G multiply-adds/s | share of peak |" + (" without AMX ms | x |" if ab else ""))
    print("|---|---|---|---|---|" + ("---|---|" if ab else ""))
    rng = np.random.default_rng(0)
    layers = {name: random_layer(args.format, n, k, rng) for name, (n, k) in SHAPES.items()}
    per_row = {}
    for m in rows:
        layer_macs = layer_s = 0.0
        for name, layer in layers.items():
            repeats = args.repeats if m < 256 else max(3, args.repeats // 2)
            s, off = amx_pair_seconds(layer, m, repeats) if ab else (kernel_seconds(layer, m, repeats), 0.0)
            macs = m * layer.out_features * layer.in_features
            layer_macs, layer_s = layer_macs + PER_LAYER[name] * macs, layer_s + PER_LAYER[name] * s
            print(f"| {name} {layer.out_features} x {layer.in_features} | {m} | {s * 1e3:.2f} | {macs / s / 1e9:.1f} | "
                  f"{macs / s / best:.1%} |" + (f" {off * 1e3:.2f} | {off / s:.2f} |" if ab else ""))
        per_row[m] = layer_macs / layer_s
    print(f"\none layer's linears (q, k, v, o, gate, up, down) against the {best_isa} peak of {best / 1e9:.1f} G/s:")
    print("| rows | G multiply-adds/s | share of peak |")
    print("|---|---|---|")
    for m, r in per_row.items():
        print(f"| {m} | {r / 1e9:.1f} | {r / best:.1%} |")


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "?")
    except OSError:
        return "?"


if __name__ == "__main__":
    main()
