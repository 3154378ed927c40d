"""The row-wise attention of a decode step or a verification on a long cache, against the memory's rate.

    python -m benchmarks.attention_stream [--caches 200,1200,2500] [--rows 1,5,9] [--layers 28] [--kv-heads 2]
                                          [--heads-per-kv 6] [--head-size 128] [--repeats 10]

A pass of a few rows reads every layer's cached keys and values once (28 layers of Qwen2.5-Coder-1.5B: 57 KB a
token, 143 MB at 2,500 tokens), so past a few hundred tokens its attention is a stream from memory. For each cache
length and rows per pass this times csrc/row_attention.cpp's `attend` over the layers, each layer with its own
key and value buffers (as a model's cache: nothing left in the caches by the layer before), in tiles (as the runtime
calls it) and row at a time (tile_rows = 1), alternating, medians of `--repeats`; and `torch.sum` over the same
bytes, the rate a plain read of them gets on this machine. Both ways must give the same bits: the probe says if
they do not. No model is loaded: the shapes are the flags' (defaults: the 1.5B target).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from specstruct.runtime import packed


def stream(caches: list[int], rows: list[int], layers: int, kv_heads: int, heads_per_kv: int, head_size: int,
           repeats: int) -> list[dict[str, float]]:
    """Per (cache, rows): milliseconds of the layers' attention in tiles and row at a time, of torch.sum over the
    same keys and values, the megabytes read, and whether the two ways gave the same bits."""
    ext = packed._KERNEL.load()
    if ext is None:
        raise SystemExit(f"the C++ attention is not built: {packed._KERNEL.error}")
    gen = torch.Generator().manual_seed(0)
    out = []
    for cache in caches:
        keys = [torch.randn(kv_heads, cache + max(rows), head_size, generator=gen) for _ in range(layers)]
        values = [torch.randn(kv_heads, cache + max(rows), head_size, generator=gen) for _ in range(layers)]
        for n in rows:
            q = torch.randn(kv_heads, heads_per_kv, n, head_size, generator=gen)
            seen = cache + n

            def attend(tile_rows: int) -> list[torch.Tensor]:
                return [ext.attend(q, k[:, :seen], v[:, :seen], head_size ** -0.5, 0, 0.0, tile_rows)
                        for k, v in zip(keys, values)]

            def read() -> None:
                for k, v in zip(keys, values):
                    k[:, :seen].sum()
                    v[:, :seen].sum()

            same = all(torch.equal(a, b) for a, b in zip(attend(packed.TILE_ROWS), attend(1)))
            times: dict[str, list[float]] = {"tiles": [], "rows_at_a_time": [], "read": []}
            for r in range(repeats + 1):  # the first round warms up
                sides = [("tiles", lambda: attend(packed.TILE_ROWS)), ("rows_at_a_time", lambda: attend(1)),
                         ("read", read)]
                for name, fn in sides if r % 2 else reversed(sides):
                    t0 = time.perf_counter()
                    fn()
                    if r:
                        times[name].append(time.perf_counter() - t0)
            ms = {name: statistics.median(t) * 1e3 for name, t in times.items()}
            out.append(dict(cache=cache, rows=n, mb=2 * layers * kv_heads * seen * head_size * 4 / 1e6,
                            same_bits=same, **ms))
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--caches", default="200,1200,2500", help="tokens already in the cache, comma-separated")
    ap.add_argument("--rows", default="1,5,9", help="query rows per pass, comma-separated")
    ap.add_argument("--layers", type=int, default=28)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--heads-per-kv", type=int, default=6)
    ap.add_argument("--head-size", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=10)
    args = ap.parse_args(argv)
    res = stream([int(c) for c in args.caches.split(",")], [int(n) for n in args.rows.split(",")], args.layers,
                 args.kv_heads, args.heads_per_kv, args.head_size, args.repeats)
    print(f"{args.layers} layers, {args.kv_heads} KV heads x {args.heads_per_kv} query heads of {args.head_size}, "
          f"{torch.get_num_threads()} threads; medians of {args.repeats}, the three alternating")
    print("| cache | rows | MB read | tiles ms | row at a time ms | torch.sum of the same bytes ms | tiles GB/s | "
          "same bits |")
    print("|---|---|---|---|---|---|---|---|")
    for r in res:
        print(f"| {r['cache']} | {r['rows']} | {r['mb']:.0f} | {r['tiles']:.2f} | {r['rows_at_a_time']:.2f} | "
              f"{r['read']:.2f} | {r['mb'] / r['tiles']:.1f} | {r['same_bits']} |")


if __name__ == "__main__":
    main()
