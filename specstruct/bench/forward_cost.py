"""Cost of one target pass over k new tokens, stock transformers numerics vs specstruct's row-invariant runtime.

    python -m specstruct.bench.forward_cost [--models qwen2.5-coder-1.5b,qwen2.5-coder-0.5b] [--repeats 5]

Prints, per model and numerics, the median milliseconds of a pass of k = 1, 2, 4, 8, 9 tokens on a 200-token cache
and v(k) = T(k) / T(1): the verification cost that decides whether speculation can pay. Draft models (every model
after the first) are also timed in the dynamic int8 numerics specstruct gives drafts by default, and the
draft/target cost ratio c is printed for both.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from ..decoding.runtime import ModelRuntime, quantize_draft, restore_stock

KS = (1, 2, 4, 8, 9)


def measure(model, numerics: str, cache_len: int = 200, repeats: int = 5, ks=KS) -> dict[int, float]:
    """Median seconds of extend(k) after a `cache_len`-token prefill, for each k."""
    if numerics == "stock":
        restore_stock(model)
    elif numerics == "int8":
        model = quantize_draft(model)
    rt = ModelRuntime(model, row_invariant=(numerics != "stock"))
    vocab = rt.vocab_size
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, min(vocab, 50_000), (cache_len,), generator=gen).tolist()
    rt.prefill(prompt)
    out = {}
    for k in ks:
        times = []
        for r in range(repeats + 1):  # first pass of each size is a warm-up
            ids = torch.randint(0, min(vocab, 50_000), (k,), generator=gen).tolist()
            t0 = time.perf_counter()
            rt.extend(ids)
            dt = time.perf_counter() - t0
            rt.crop(cache_len)
            if r:
                times.append(dt)
        out[k] = statistics.median(times)
    return out


def main(argv: list[str] | None = None) -> None:
    from rich.console import Console
    from rich.table import Table

    from ..models import load

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="qwen2.5-coder-1.5b,qwen2.5-coder-0.5b")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: leave torch's default)")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    table = Table(title=f"one pass of k new tokens on a 200-token cache (median of {args.repeats}, ms), "
                        f"{torch.get_num_threads()} threads")
    table.add_column("model")
    table.add_column("numerics")
    for k in KS:
        table.add_column(f"k={k}", justify="right")
    table.add_column("v(8)=T(8)/T(1)", justify="right")
    one_token: dict[tuple[str, str], float] = {}
    names = args.models.split(",")
    for i, name in enumerate(names):
        model, _ = load(name)
        for numerics in ("stock", "row-invariant") + (("int8",) if i else ()):  # int8: draft models only
            t = measure(model, numerics, repeats=args.repeats)
            one_token[(name, numerics)] = t[1]
            table.add_row(name, numerics, *[f"{t[k] * 1000:.0f}" for k in KS], f"{t[8] / t[1]:.2f}")
        del model
    console = Console()
    console.print(table)
    if len(names) >= 2:
        t1 = one_token[(names[0], "row-invariant")]
        for numerics in ("row-invariant", "int8"):
            console.print(f"draft/target one-token cost ratio c = {one_token[(names[1], numerics)] / t1:.2f} "
                          f"({names[1]} {numerics} / {names[0]} row-invariant float32)")


if __name__ == "__main__":
    main()
