"""Where a cold prefill goes, the attention in tiles against row at a time, and llama.cpp on the same file, in one
process.

    python -m benchmarks.prefill_cost [--model qwen2.5-coder-1.5b] [--tokens 1024] [--chunk 256] [--rounds 5]
                                      [--tiles 1,8] [--threads N] [--llama-bench PATH/llama-bench]

A cold prefill of `--tokens` tokens in `--chunk`-token passes (step_cost's), through specstruct's runtime. Each
round times one prefill per `--tiles` value (packed.TILE_ROWS: the query rows the C++ attention computes together;
1 is row at a time), then `llama-bench -p TOKENS -n 0 -r 1` on the same file with the same threads, so the sides
alternate while the machine's load drifts; medians over rounds. A last prefill per tile value is timed by parts
(step_breakdown's wrappers): the linear layers, the attention (its KV cache update apart), the norms and rotary
embedding, the rest. Every tile value's logits must be the same bits: the probe says if they are not.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import statistics
import subprocess
import time
from pathlib import Path

import torch

from benchmarks.step_breakdown import _timed
from specstruct.runtime import packed
from specstruct.testing import OneSequence


def prefill(rt: OneSequence, tokens: int, chunk: int) -> tuple[float, torch.Tensor]:
    """(seconds, the last position's logits) of a cold prefill of `tokens` ids in `chunk`-token passes."""
    vocab = rt.vocab_size
    cold = rt.sequence()
    t0 = time.perf_counter()
    logits = None
    for start in range(0, tokens, chunk):
        ids = [(1000 + i) % vocab for i in range(start, min(tokens, start + chunk))]
        out = rt.forward([(cold, ids)], [1 if start + chunk >= tokens else 0])
        logits = out[0] if out[0].numel() else logits
    assert logits is not None
    return time.perf_counter() - t0, logits


def parts(rt: OneSequence, tokens: int, chunk: int) -> dict[str, float]:
    """Seconds of one cold prefill and of its parts (see the module docstring)."""
    from transformers import DynamicCache

    from specstruct.runtime import fused_layer
    from specstruct.runtime.quantized import QuantLinear, QuantWeight

    totals: collections.Counter = collections.Counter()
    with contextlib.ExitStack() as stack:
        for m in rt.model.modules():  # float or int8 Linear layers (block-quantized ones: QuantWeight.linear below)
            if hasattr(m, "in_features") and hasattr(m, "out_features") and not isinstance(m, QuantLinear):
                stack.enter_context(_timed(totals, "linear layers", m, "forward"))
        stack.enter_context(_timed(totals, "linear layers", QuantWeight, "linear"))
        ops = fused_layer._KERNEL.module
        for name in ("rms_norm", "add_rms_norm", "rope_", "silu_mul") if ops is not None else ():
            stack.enter_context(_timed(totals, "norms, rotary, activation", ops, name))
        stack.enter_context(_timed(totals, "kv cache update", DynamicCache, "update"))
        stack.enter_context(_timed(totals, "attention", packed, "attend_pass"))
        total, _ = prefill(rt, tokens, chunk)
    out = {"prefill": total, **totals}
    out["attention"] -= out.get("kv cache update", 0.0)  # the update runs inside attend_pass
    out["the rest"] = total - sum(v for k, v in out.items() if k != "prefill")
    return out


def llama(binary: str, path: Path, tokens: int) -> float:
    """Seconds of llama-bench's prefill of `tokens` tokens (-n 0, one repetition) with torch's thread count."""
    out = subprocess.run([binary, "-m", str(path), "-t", str(torch.get_num_threads()), "-p", str(tokens), "-n", "0",
                          "-r", "1", "-o", "json"], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)[0]["avg_ns"] / 1e9


def main(argv: list[str] | None = None) -> None:
    from specstruct.models.loading import gguf_file, resolve
    from specstruct.runtime.gguf_model import load_model

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen2.5-coder-1.5b")
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--chunk", type=int, default=256, help="tokens per pass (the scheduler's idle prefill chunk)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--tiles", default=f"1,{packed.TILE_ROWS}", help="packed.TILE_ROWS values, comma-separated")
    ap.add_argument("--llama-bench", default=None, help="llama.cpp's llama-bench binary: its side on the same file")
    ap.add_argument("--threads", type=int, default=None, help="both sides' threads (default: torch's)")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    tiles = [int(t) for t in args.tiles.split(",")]
    model, _ = load_model(args.model)
    rt = OneSequence(model)
    path = gguf_file(resolve(args.model))
    times: dict[str, list[float]] = collections.defaultdict(list)
    logits: dict[int, torch.Tensor] = {}
    before = packed.TILE_ROWS
    try:
        for tile in tiles:  # warm-up: kernels built, buffers grown
            packed.TILE_ROWS = tile
            prefill(rt, min(args.tokens, args.chunk), args.chunk)
        for _ in range(args.rounds):
            for tile in tiles:
                packed.TILE_ROWS = tile
                seconds, logits[tile] = prefill(rt, args.tokens, args.chunk)
                times[f"tiles of {tile}"].append(seconds)
            if args.llama_bench and path is not None:
                times["llama.cpp"].append(llama(args.llama_bench, path, args.tokens))
        split = {}
        for tile in tiles:
            packed.TILE_ROWS = tile
            split[tile] = parts(rt, args.tokens, args.chunk)
    finally:
        packed.TILE_ROWS = before
    print(f"{args.model}, {torch.get_num_threads()} threads, cold prefill of {args.tokens} tokens in {args.chunk}-token "
          f"passes; median of {args.rounds} alternating rounds; {rt.numerics}")
    same = all(torch.equal(logits[t], logits[tiles[0]]) for t in tiles)
    print(f"logits of every tile size the same bits: {same}")
    med = {key: statistics.median(v) for key, v in times.items()}
    for key, value in med.items():
        line = f"{key:<14}{value * 1e3:9.0f} ms  {args.tokens / value:7.0f} tokens/s"
        if "llama.cpp" in med and key != "llama.cpp":
            line += f"   llama.cpp / this {med['llama.cpp'] / value:.2f}x"
        print(line)
    if len(tiles) > 1:
        a, b = f"tiles of {tiles[0]}", f"tiles of {tiles[-1]}"
        ratios = [x / y for x, y in zip(times[a], times[b])]
        print(f"{a} / {b}: {statistics.median(ratios):.3f}x (median of the rounds' ratios)")
    for tile, split_s in split.items():
        print(f"tiles of {tile}, one prefill by parts:")
        for name, seconds in sorted(split_s.items(), key=lambda kv: -kv[1]):
            print(f"  {name:28s} {seconds * 1e3:7.0f} ms")


if __name__ == "__main__":
    main()
