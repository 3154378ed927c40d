"""One target pass, side by side with llama.cpp on the same GGUF file: k new tokens on a cached prefix, and a cold
prefill.

    python -m benchmarks.step_cost [--model qwen2.5-coder-1.5b] [--weights auto] [--ks 1,9] [--cache 200]
                                         [--prefill 256] [--repeats 9] [--rounds 3] [--llama-bench PATH/llama-bench]

specstruct's side is the production runtime (runtime.model_runtime.ModelRuntime) on the model as `from_pretrained` loads
it (`--weights`: auto keeps the GGUF blocks); llama.cpp's side is `llama-bench -p K -n 0 -d CACHE` (a pass of K tokens
at CACHE cached tokens) and `-p PREFILL` on the same file with the same thread count, the two sides alternating for
`--rounds` rounds. Prints the median milliseconds of each, v(k) = T(k) / T(1) (what speculative verification costs), prefill tokens/s, and the ratios.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import time
from pathlib import Path

import torch
from specstruct.testing import OneSequence


def ours(model: str, weights: str) -> tuple[OneSequence, Path]:
    from specstruct.runtime.gguf_model import load_model
    from specstruct.models.loading import gguf_file, resolve

    m, _ = load_model(model, weights=weights)
    return OneSequence(m), gguf_file(resolve(model))


def measure(rt: OneSequence, ks: list[int], cache: int, prefill: int, repeats: int) -> dict:
    vocab = rt.vocab_size  # (ids as they are on a real vocabulary; wrapped on a tiny one: benchmarks.arch_step)
    seq = rt.sequence()
    rt.forward([(seq, [i % vocab for i in range(1000, 1000 + cache)])], [1])
    ms = {}
    for k in ks:
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            rt.forward([(seq, [i % vocab for i in range(3000, 3000 + k)])], [k])
            times.append(time.perf_counter() - t0)
            seq.crop(cache)
        ms[f"{k} tokens at {cache}"] = statistics.median(times) * 1e3
    if prefill:
        times = []
        for _ in range(max(1, repeats // 3)):
            cold = rt.sequence()
            t0 = time.perf_counter()
            for start in range(0, prefill, 256):  # the scheduler's idle prefill chunk
                ids = [i % vocab for i in range(1000 + start, 1000 + min(prefill, start + 256))]
                rt.forward([(cold, ids)], [1 if start + 256 >= prefill else 0])
            times.append(time.perf_counter() - t0)
        ms[f"prefill {prefill}"] = statistics.median(times) * 1e3
    return ms


def llama(binary: str, path: Path, ks: list[int], cache: int, prefill: int, repeats: int) -> dict:
    threads = str(torch.get_num_threads())
    ms = {}
    for k in ks:
        out = subprocess.run([binary, "-m", str(path), "-t", threads, "-p", str(k), "-n", "0", "-d", str(cache),
                              "-r", str(repeats), "-o", "json"], capture_output=True, text=True, check=True)
        ms[f"{k} tokens at {cache}"] = json.loads(out.stdout)[0]["avg_ns"] / 1e6
    if prefill:
        out = subprocess.run([binary, "-m", str(path), "-t", threads, "-p", str(prefill), "-n", "0",
                              "-r", str(max(1, repeats // 3)), "-o", "json"], capture_output=True, text=True, check=True)
        ms[f"prefill {prefill}"] = json.loads(out.stdout)[0]["avg_ns"] / 1e6
    return ms


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen2.5-coder-1.5b")
    ap.add_argument("--weights", default="auto", help="auto (the GGUF blocks), q8_0 or float32")
    ap.add_argument("--ks", default="1,9", help="new tokens per pass, comma-separated")
    ap.add_argument("--cache", type=int, default=200, help="tokens already cached")
    ap.add_argument("--prefill", type=int, default=256, help="cold prefill of this many tokens (0: none)")
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--llama-bench", default=None, help="llama.cpp's llama-bench binary: its side on the same file")
    ap.add_argument("--rounds", type=int, default=3,
                    help="alternate the two sides this many times (the machine's load drifts); medians over rounds")
    args = ap.parse_args(argv)
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")
    ks = [int(k) for k in args.ks.split(",")]
    rt, path = ours(args.model, args.weights)
    rounds_mine: list[dict] = []
    rounds_theirs: list[dict] = []
    for _ in range(args.rounds):
        rounds_mine.append(measure(rt, ks, args.cache, args.prefill, args.repeats))
        if args.llama_bench and path is not None:
            rounds_theirs.append(llama(args.llama_bench, path, ks, args.cache, args.prefill, args.repeats))
    mine = {key: statistics.median(r[key] for r in rounds_mine) for key in rounds_mine[0]}
    theirs = {key: statistics.median(r[key] for r in rounds_theirs) for key in rounds_theirs[0]} if rounds_theirs else {}
    ratio = {key: statistics.median(t[key] / m[key] for m, t in zip(rounds_mine, rounds_theirs)) for key in theirs}
    print(f"{args.model}, {torch.get_num_threads()} threads; specstruct: {rt.numerics}")
    print(f"median of {args.rounds} alternating rounds; the ratio is the median of the rounds' ratios")
    print(f"{'pass':<22}{'specstruct ms':>15}{'llama.cpp ms':>15}{'llama.cpp / specstruct':>24}")
    for key, value in mine.items():
        other = theirs.get(key)
        print(f"{key:<22}{value:>15.1f}" + (f"{other:>15.1f}{ratio[key]:>23.2f}x" if other else ""))
    one, most = f"1 tokens at {args.cache}", f"{max(ks)} tokens at {args.cache}"
    if one in mine and most in mine and max(ks) > 1:
        line = f"v({max(ks)}) = T({max(ks)}) / T(1): specstruct {mine[most] / mine[one]:.2f}x"
        print(line + (f", llama.cpp {theirs[most] / theirs[one]:.2f}x" if one in theirs else ""))
    key = f"prefill {args.prefill}"
    if key in mine:
        line = f"prefill tokens/s: specstruct {args.prefill / mine[key] * 1e3:.0f}"
        print(line + (f", llama.cpp {args.prefill / theirs[key] * 1e3:.0f}" if key in theirs else ""))


if __name__ == "__main__":
    main()
