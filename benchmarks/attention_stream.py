"""The row-wise attention of a decode step or a verification on a long cache, against the memory's rate, and
against another version of its source.

    python -m benchmarks.attention_stream [--caches 200,1200,2500] [--rows 1,5,9] [--layers 28] [--kv-heads 2]
                                          [--heads-per-kv 6] [--head-size 128] [--repeats 10] [--commit REV]
    python -m benchmarks.attention_stream --commit REV --model qwen2.5-coder-1.5b [--caches 2500] [--rows 1,5,9]

A pass of a few rows reads every layer's cached keys and values once (28 layers of Qwen2.5-Coder-1.5B: 57 KB a
token, 143 MB at 2,500 tokens), so past a few hundred tokens its attention is a stream from memory. For each cache
length and rows per pass this times csrc/row_attention.cpp's `attend` over the layers, each layer with its own
key and value buffers (as a model's cache: nothing left in the caches by the layer before), in tiles (as the runtime
calls it) and row at a time (tile_rows = 1), and `torch.sum` over the same bytes, the rate a plain read of them gets
on this machine; `--commit REV` adds the source as of that commit, built beside this tree's (as the runtime calls it).
All alternate, medians of `--repeats`; every way must give the same bits: the probe says if they do not. No model
is loaded: the shapes are the flags' (defaults: the 1.5B target).

`--model NAME` (with `--commit`) times that model's passes instead: `--rows` new tokens on a cache of each
`--caches` length, this tree's attention and REV's swapped in pass by pass on the same model, and checks the
logits are the same bits.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch

from benchmarks.source_at import other_kernel
from specstruct.runtime import packed

SOURCE = "specstruct/runtime/csrc/row_attention.cpp"


def _this() -> Any:
    ext = packed._KERNEL.load()
    if ext is None:
        raise SystemExit(f"the C++ attention is not built: {packed._KERNEL.error}")
    return ext


def _alternate(sides: list[tuple[str, Callable[[], object]]], repeats: int) -> dict[str, float]:
    """Median milliseconds of each side, the sides alternating (order reversed every other round), one warm-up."""
    times: dict[str, list[float]] = {name: [] for name, _ in sides}
    for r in range(repeats + 1):
        for name, fn in sides if r % 2 else list(reversed(sides)):
            t0 = time.perf_counter()
            fn()
            if r:
                times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(t) * 1e3 for name, t in times.items()}


def stream(caches: list[int], rows: list[int], layers: int, kv_heads: int, heads_per_kv: int, head_size: int,
           repeats: int, other: Any = None) -> list[dict[str, Any]]:
    """Per (cache, rows): milliseconds of the layers' attention in tiles, row at a time, by `other` (another build,
    if given), of torch.sum over the same keys and values, the megabytes read, and whether every way gave the same
    bits."""
    ext = _this()
    gen = torch.Generator().manual_seed(0)
    out = []
    for cache in caches:
        keys = [torch.randn(kv_heads, cache + max(rows), head_size, generator=gen) for _ in range(layers)]
        values = [torch.randn(kv_heads, cache + max(rows), head_size, generator=gen) for _ in range(layers)]
        for n in rows:
            q = torch.randn(kv_heads, heads_per_kv, n, head_size, generator=gen)
            seen = cache + n

            def attend(tile_rows: int, by: Any = ext) -> list[torch.Tensor]:
                return [by.attend(q, k[:, :seen], v[:, :seen], head_size ** -0.5, 0, 0.0, tile_rows)
                        for k, v in zip(keys, values)]

            def read() -> None:
                for k, v in zip(keys, values):
                    k[:, :seen].sum()
                    v[:, :seen].sum()

            tiles = attend(packed.TILE_ROWS)
            others = [attend(1)] + ([attend(packed.TILE_ROWS, other)] if other is not None else [])
            same = all(torch.equal(a, b) for o in others for a, b in zip(tiles, o))
            sides: list[tuple[str, Callable[[], object]]] = [
                ("tiles", lambda: attend(packed.TILE_ROWS)), ("rows_at_a_time", lambda: attend(1)), ("read", read)]
            if other is not None:
                sides.append(("other", lambda: attend(packed.TILE_ROWS, other)))
            ms = _alternate(sides, repeats)
            out.append(dict(cache=cache, rows=n, mb=2 * layers * kv_heads * seen * head_size * 4 / 1e6,
                            same_bits=same, **ms))
    return out


@contextlib.contextmanager
def _attention(ext: Any) -> Iterator[None]:
    """The runtime's C++ attention computed by `ext` (another build of the same source) for a while."""
    before = packed._KERNEL.module
    packed._KERNEL.module = ext
    try:
        yield
    finally:
        packed._KERNEL.module = before


def passes(model: torch.nn.Module, caches: list[int], rows: list[int], repeats: int, other: Any) -> list[dict[str, Any]]:
    """Per (cache, rows): milliseconds of the model's pass of `rows` new tokens on a `cache`-token cache with this
    tree's attention and with `other`'s, and whether the logits are the same bits."""
    from specstruct.testing import OneSequence

    ext = _this()
    rt = OneSequence(model)
    rt.prefill_chunk = 256  # the scheduler's idle prefill chunk (no result depends on it)
    out = []
    for cache in caches:
        ids = torch.randint(0, min(rt.vocab_size, 50_000), (cache + max(rows),),
                            generator=torch.Generator().manual_seed(1)).tolist()
        rt.prefill(ids[:cache])  # a new sequence
        for n in rows:
            logits: dict[str, torch.Tensor] = {}

            def step(name: str, by: Any, n: int = n) -> None:
                with _attention(by):
                    logits[name] = rt.extend(ids[cache : cache + n])
                rt.crop(cache)

            ms = _alternate([("this", lambda: step("this", ext)), ("other", lambda: step("other", other))], repeats)
            out.append(dict(cache=cache, rows=n, same_bits=torch.equal(logits["this"], logits["other"]), **ms))
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
    ap.add_argument("--commit", help=f"also time {SOURCE} as of this git commit, built beside this tree's")
    ap.add_argument("--model", help="time this model's passes with the two attentions (needs --commit; the shape "
                                    "flags are then the model's; a registry name is pulled on first use, ~1 GB)")
    args = ap.parse_args(argv)
    if args.model and not args.commit:
        ap.error("--model compares this tree's attention with another's: give --commit")
    caches, rows = [int(c) for c in args.caches.split(",")], [int(n) for n in args.rows.split(",")]
    other = other_kernel(SOURCE, commit=args.commit) if args.commit else None
    if args.model:
        from specstruct.runtime.gguf_model import load_model

        model, _ = load_model(args.model)  # as the engine loads it: a GGUF file's blocks kept
        print(f"{args.model}, {torch.get_num_threads()} threads; a pass of each rows on each cache, this tree's "
              f"attention and {args.commit}'s alternating, medians of {args.repeats}")
        print(f"| cache | rows | this tree ms | {args.commit} ms | {args.commit} / this | same logits |")
        print("|---|---|---|---|---|---|")
        for r in passes(model, caches, rows, args.repeats, other):
            print(f"| {r['cache']} | {r['rows']} | {r['this']:.1f} | {r['other']:.1f} | {r['other'] / r['this']:.2f}x "
                  f"| {r['same_bits']} |")
        return
    res = stream(caches, rows, args.layers, args.kv_heads, args.heads_per_kv, args.head_size, args.repeats, other)
    print(f"{args.layers} layers, {args.kv_heads} KV heads x {args.heads_per_kv} query heads of {args.head_size}, "
          f"{torch.get_num_threads()} threads; medians of {args.repeats}, the ways alternating")
    extra = f" {args.commit} ms |" if other is not None else ""
    print(f"| cache | rows | MB read | tiles ms | row at a time ms | torch.sum of the same bytes ms |{extra} tiles GB/s "
          f"| same bits |")
    print("|---|---|---|---|---|---|" + ("---|" if other is not None else "") + "---|---|")
    for r in res:
        cell = f" {r['other']:.2f} |" if other is not None else ""
        print(f"| {r['cache']} | {r['rows']} | {r['mb']:.0f} | {r['tiles']:.2f} | {r['rows_at_a_time']:.2f} | "
              f"{r['read']:.2f} |{cell} {r['mb'] / r['tiles']:.1f} | {r['same_bits']} |")


if __name__ == "__main__":
    main()
