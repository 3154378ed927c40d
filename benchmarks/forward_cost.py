"""Cost of one target pass over k new tokens, stock transformers numerics vs specstruct's row-invariant runtime
with each of its Linear kernels (the fixed-order one, the default, and oneDNN's).

    python -m benchmarks.forward_cost [--models qwen2.5-coder-1.5b,qwen2.5-coder-0.5b] [--repeats 5] [--profile 1]
                                            [--prefill 380] [--ks 1,2,4,8,9] [--cache 200]

Prints, per model and numerics, the median milliseconds of a pass of k = 1, 2, 4, 8, 9 tokens (`--ks`) on a
200-token cache (`--cache`) and v(k) = T(k) / T(1) (k = 8, else the largest): the verification cost that decides
whether speculation can pay (`--ks 1,9,18,36,56,72`: the passes of 8 concurrent speculating requests). Draft models
(every model after the first) are also timed in the dynamic int8 numerics specstruct gives drafts by default, and the
draft/target cost ratio c is printed for both. `--profile K` adds, per model and numerics, the ops that take the
most time in a pass of K tokens, by input shape (which Linear is which): where the one-token step goes.
`--prefill N` times a cold prefill of N tokens, stock against the chunks specstruct's scheduler uses.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from specstruct.runtime import fixed_linear
from specstruct.runtime.model_runtime import quantize_draft, restore_stock
from specstruct.runtime.owned import hand_over
from specstruct.testing import OneSequence

KS = (1, 2, 4, 8, 9)
NUMERICS = {"stock": "stock", "row-invariant, oneDNN": "onednn", "row-invariant, fixed-order": "fixed",
            "int8 weight-only": "fixed", "int8 dynamic (torch.ao)": "fixed"}
DRAFT_ONLY = ("int8 weight-only", "int8 dynamic (torch.ao)")


def measure(model, numerics: str, cache_len: int = 200, repeats: int = 5, ks=KS,
            profile: list | None = None) -> dict[int, float]:
    """Median seconds of extend(k) after a `cache_len`-token prefill, for each k. With `profile` (a list), the
    ops of `repeats` passes of the last k are appended to it as (op, input shapes, ms per pass)."""
    restore_stock(model)
    hand_over(model)  # switched in place, as the engine does the models it loads (one copy of the weights)
    with fixed_linear.using(NUMERICS[numerics]):  # read when the runtime packs the weights
        if numerics.startswith("int8"):
            model = quantize_draft(model, torchao="torch.ao" in numerics)
        rt = OneSequence(model, row_invariant=(numerics != "stock"))
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
    if profile is not None:
        from torch.profiler import ProfilerActivity
        from torch.profiler import profile as torch_profile

        with torch_profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
            for _ in range(repeats):
                rt.extend(torch.randint(0, min(vocab, 50_000), (ks[-1],), generator=gen).tolist())
                rt.crop(cache_len)
        for ev in prof.key_averages(group_by_input_shape=True):
            if ev.self_cpu_time_total > 0:
                profile.append((ev.key, ev.input_shapes, ev.self_cpu_time_total / 1000 / repeats))
    return out


def prefill_cost(model, tokens: int, repeats: int = 3) -> dict[str, float]:
    """Median seconds of a cold prefill of `tokens` tokens (logits of the last only): transformers' stock forward in
    one block (stock Linear, SDPA) against specstruct's row-invariant runtime in the chunks its scheduler uses, 256
    tokens (no row decoding, IDLE_PREFILL) and 32 (the floor while rows decode). Leaves the model row-invariant."""
    from specstruct.spec.prefill_budget import IDLE_PREFILL

    from specstruct.models.loading import output_rows

    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, min(output_rows(model), 50_000), (tokens,), generator=gen).tolist()
    restore_stock(model)
    stock = []
    with torch.inference_mode():
        for _ in range(repeats):
            t0 = time.perf_counter()
            model(input_ids=torch.tensor([ids]), logits_to_keep=1)
            stock.append(time.perf_counter() - t0)
    hand_over(model)
    rt = OneSequence(model)
    out = {"stock one block": statistics.median(stock)}
    for chunk in (IDLE_PREFILL, 32):
        rt.prefill_chunk, times = chunk, []
        for _ in range(repeats):
            t0 = time.perf_counter()
            rt.prefill(ids)
            times.append(time.perf_counter() - t0)
        out[f"row-invariant, {chunk}-token chunks"] = statistics.median(times)
    return out


def print_profile(console, title: str, rows: list, top: int = 8) -> None:
    """The ops that take the most self time in one pass, with their input shapes (which Linear is which)."""
    from rich.table import Table

    total = sum(ms for _, _, ms in rows)
    table = Table(title=f"{title}: self CPU time per pass, {total:.0f} ms in all")
    for col in ("op", "input shapes", "ms per pass", "share"):
        table.add_column(col, justify="right" if col in ("ms per pass", "share") else "left")
    for op, shapes, ms in sorted(rows, key=lambda r: -r[2])[:top]:
        table.add_row(op, str([s for s in shapes if s])[:60], f"{ms:.1f}", f"{ms / total:.0%}")
    console.print(table)


def main(argv: list[str] | None = None) -> None:
    from rich.console import Console
    from rich.table import Table

    from specstruct.models import load

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="qwen2.5-coder-1.5b,qwen2.5-coder-0.5b")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: leave torch's default)")
    ap.add_argument("--ks", default=",".join(map(str, KS)), help="new tokens per pass, comma-separated (the batched "
                    "passes of 8 concurrent requests: 1,9,18,36,56,72)")
    ap.add_argument("--cache", type=int, default=200, help="tokens already in the cache")
    ap.add_argument("--profile", type=int, default=0, metavar="K",
                    help="also profile passes of K tokens (K must be one of 1, 2, 4, 8, 9): the ops taking the most "
                         "time, by input shape, for each model and numerics")
    ap.add_argument("--prefill", type=int, default=0, metavar="N",
                    help="also time a cold prefill of N tokens on the first model: stock one block vs the "
                         "row-invariant runtime in 256- and 32-token chunks")
    args = ap.parse_args(argv)
    columns = tuple(int(k) for k in args.ks.split(","))
    if 1 not in columns:
        ap.error("--ks must include 1 (the one-token cost every ratio is taken against)")
    if args.profile and args.profile not in columns:
        ap.error(f"--profile takes one of {columns}")
    ks = tuple(k for k in columns if k != args.profile) + ((args.profile,) if args.profile else ())
    if args.threads:
        torch.set_num_threads(args.threads)
    table = Table(title=f"one pass of k new tokens on a {args.cache}-token cache (median of {args.repeats}, ms), "
                        f"{torch.get_num_threads()} threads")
    table.add_column("model")
    table.add_column("numerics")
    for k in columns:
        table.add_column(f"k={k}", justify="right")
    top = 8 if 8 in columns else max(columns)  # v(8): the ratio quoted across the docs
    table.add_column(f"v({top})=T({top})/T(1)", justify="right")
    one_token: dict[tuple[str, str], float] = {}
    names = args.models.split(",")
    console, profiles = Console(), []
    for i, name in enumerate(names):
        model, _ = load(name)
        if args.prefill and i == 0:
            cost = prefill_cost(model, args.prefill, repeats=max(1, min(args.repeats, 3)))
            base = cost["stock one block"]
            console.print(f"cold prefill of {args.prefill} tokens, {name} (median s): " + "; ".join(
                f"{how} {t:.2f} ({t / base:.2f}x)" for how, t in cost.items()))
        for numerics in [n for n in NUMERICS if i or n not in DRAFT_ONLY]:
            rows: list | None = [] if args.profile else None
            t = measure(model, numerics, cache_len=args.cache, repeats=args.repeats, ks=ks, profile=rows)
            one_token[(name, numerics)] = t[1]
            table.add_row(name, numerics, *[f"{t[k] * 1000:.0f}" for k in columns], f"{t[top] / t[1]:.2f}")
            if rows:
                profiles.append((f"{name}, {numerics}, k={args.profile}", rows))
        del model
    for title, rows in profiles:
        print_profile(console, title, rows)
    console.print(table)
    if len(names) >= 2:
        t1 = one_token[(names[0], "row-invariant, fixed-order")]
        for numerics in ("row-invariant, fixed-order", *DRAFT_ONLY):
            console.print(f"draft/target one-token cost ratio c = {one_token[(names[1], numerics)] / t1:.2f} "
                          f"({names[1]} {numerics} / {names[0]} row-invariant, fixed-order, float32)")


if __name__ == "__main__":
    main()
