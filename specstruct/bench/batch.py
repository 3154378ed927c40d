"""Batched decoding measured side by side: N concurrent extraction requests through one BatchDecoder against the
same requests one at a time, on the same engine in the same process.

    python -m specstruct.bench.batch --concurrency 1,4,8 --requests 8      # real pair, prints JSON lines

`measure_batch` and `measure_prefill_interference` are the functions `specstruct bench --scenario batch` builds on.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from specstruct.spec.batch import BatchDecoder


@dataclass
class Request:
    ids: list[int]
    constraint: Any
    config: Any


def requests_for(engine, workloads: Sequence[Any], *, max_new_tokens: int = 256, **overrides: Any) -> list[Request]:
    """Token ids, compiled constraint and config of each workload, as `engine.run` would send them."""
    out = []
    for w in workloads:
        cfg = engine.config.merged(max_new_tokens=max_new_tokens, **overrides)
        ids = engine.prompt_ids(w.messages, w.output_type, max_new_tokens=max_new_tokens)
        out.append(Request(ids, engine.constraint(w.output_type), cfg))
    return out


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))] if xs else 0.0


def run_requests(engine, requests: Sequence[Request], concurrency: int, *, prefill_chunk: int = 32,
                 adaptive_prefill: bool = True) -> dict[str, Any]:
    """Decode `requests` through one BatchDecoder with at most `concurrency` rows (continuous batching: a freed
    slot is refilled at the next step; concurrency 1 is one at a time). All are submitted at t = 0.
    `max_decode_step_s`: the longest step while some row was decoding (what a running row waited at most)."""
    core = engine.speculator
    rows = [core.row(r.ids, r.constraint.fork(), r.config) for r in requests]
    waiting = list(rows)
    batch = BatchDecoder(core, prefill_chunk=prefill_chunk, adaptive_prefill=adaptive_prefill)
    done_at: dict[int, float] = {}
    steps = occupied = 0
    longest = 0.0
    t0 = time.perf_counter()
    while waiting or len(batch):
        while waiting and len(batch) < concurrency:
            batch.add(waiting.pop(0))
        occupied += len(batch)
        t = time.perf_counter()
        decoding = any(not r.prefilling for r in batch.rows)
        for row, _, finished in batch.step():
            if finished:
                done_at[id(row)] = time.perf_counter() - t0
        longest = max(longest, time.perf_counter() - t) if decoding else longest
        steps += 1
    wall = time.perf_counter() - t0
    tokens = sum(len(r.token_ids) for r in rows)
    lat = [done_at[id(r)] for r in rows]
    return {
        "concurrency": concurrency, "requests": len(rows), "tokens": tokens, "wall_s": round(wall, 2),
        "tokens_per_s": round(tokens / wall, 3), "passes": steps, "tokens_per_pass": round(tokens / steps, 3),
        "rows_per_pass": round(occupied / steps, 2), "latency_p50_s": round(statistics.median(lat), 2),
        "latency_p95_s": round(_pct(lat, 0.95), 2), "max_decode_step_s": round(longest, 2),
        # one at a time, the requests' prefill (target and draft reading the prompt) in all: what batching cannot share
        "prefill_s_sum": round(sum(r.stats.prefill_s for r in rows), 2) if concurrency == 1 else None,
        "errors": [repr(r.error) for r in rows if r.error],
        "token_ids": [r.token_ids for r in rows],
    }


def measure_batch(engine, requests: Sequence[Request], concurrencies: Sequence[int], *, prefill_chunk: int = 32,
                  adaptive_prefill: bool = True,
                  report: Callable[[dict[str, Any]], None] | None = None) -> list[dict[str, Any]]:
    """The requests one at a time, then batched at each concurrency, then one at a time again (so a shared
    machine's drift is bracketed). Per concurrency: the batched figures, the throughput ratio to the mean of
    the two one-at-a-time runs, and how many outputs are identical to the one-at-a-time outputs. `report`
    receives each run as it ends (partial results survive an interrupted benchmark)."""
    report = report or (lambda run: None)
    first = run_requests(engine, requests, 1, prefill_chunk=prefill_chunk)
    report({"run": "one_at_a_time", **{k: v for k, v in first.items() if k != "token_ids"}})
    batched = []
    for c in concurrencies:
        batched.append(run_requests(engine, requests, c, prefill_chunk=prefill_chunk,
                                    adaptive_prefill=adaptive_prefill))
        same = sum(x == y for x, y in zip(first["token_ids"], batched[-1]["token_ids"]))
        report({"run": "batched", **{k: v for k, v in batched[-1].items() if k != "token_ids"},
                "identical_outputs": f"{same}/{len(requests)}"})
    last = run_requests(engine, requests, 1, prefill_chunk=prefill_chunk)
    report({"run": "one_at_a_time_again", **{k: v for k, v in last.items() if k != "token_ids"}})
    base = (first["tokens_per_s"] + last["tokens_per_s"]) / 2
    out = []
    for b in batched:
        same = [x == y for x, y in zip(first["token_ids"], b.pop("token_ids"))]
        out.append({"batched": b, "one_at_a_time_tokens_per_s": [first["tokens_per_s"], last["tokens_per_s"]],
                    "throughput_ratio": round(b["tokens_per_s"] / base, 3),
                    "identical_outputs": f"{sum(same)}/{len(same)}"})
    return out


def measure_prefill_interference(engine, running: Sequence[Request], long_prompt: Request, *,
                                 prefill_chunk: int = 32, warm_steps: int = 3,
                                 adaptive_prefill: bool = True) -> dict[str, Any]:
    """Inter-token latency of running rows while a long prompt arrives: step times with the newcomer prefilled in
    chunks (the decoder's budget with floor `prefill_chunk`), vs in one go, vs nobody arriving (seconds per step of
    the running rows; `prefill_steps`: steps the newcomer took to read its prompt)."""
    result = {}
    for label, chunk, arrive in (("no_arrival", prefill_chunk, False), ("chunked", prefill_chunk, True),
                                 ("whole_prompt", 10**9, True)):
        core = engine.speculator
        batch = BatchDecoder(core, prefill_chunk=chunk, adaptive_prefill=adaptive_prefill)
        rows = [core.row(r.ids, r.constraint.fork(), r.config) for r in running]
        for r in rows:
            batch.add(r)
        while any(r.prefilling for r in rows):
            batch.step()
        for _ in range(warm_steps):
            batch.step()
        newcomer = core.row(long_prompt.ids, long_prompt.constraint.fork(), long_prompt.config)
        if arrive:
            batch.add(newcomer)
        gaps, reading = [], 0
        for _ in range(max(4, -(-len(long_prompt.ids) // prefill_chunk) + 1)):
            t = time.perf_counter()
            if not any(not r.finished for r in rows):
                break
            reading += arrive and newcomer.prefilling
            batch.step()
            gaps.append(time.perf_counter() - t)
        result[label] = {"steps": len(gaps), "max_step_s": round(max(gaps), 3),
                         "mean_step_s": round(statistics.mean(gaps), 3), "prefill_steps": reading}
    result["long_prompt_tokens"] = len(long_prompt.ids)
    return result


def main(argv: Sequence[str] | None = None) -> None:
    import torch

    import specstruct as ss
    from specstruct.bench.workloads import extraction_workloads

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen2.5-coder-1.5b")
    ap.add_argument("--draft", default="qwen2.5-coder-0.5b", help="'' for none")
    ap.add_argument("--concurrency", default="1,4,8", help="comma-separated row counts")
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=192)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-spec", action="store_true", help="speculation off (plain batched decoding)")
    ap.add_argument("--interference", action="store_true", help="also measure a long prompt arriving")
    ap.add_argument("--interference-only", action="store_true", help="only that (no throughput runs)")
    ap.add_argument("--prefill-chunk", type=int, default=32,
                    help="prefill tokens per step while other rows decode: the floor of the adaptive budget")
    ap.add_argument("--temperature", type=float, default=0.0, help="sample (seeded by --seed) instead of greedy")
    ap.add_argument("--seed", type=int, default=1, help="each request's seed when sampling: outputs stay comparable")
    ap.add_argument("--rows-alone", action="store_true",
                    help="treat the draft as not row-invariant (as torch.ao's int8 is): seeded rows draft in passes "
                         "of their own and reuse no cached draft prompt (the rule for every int8 draft before ce7c67b)")
    ap.add_argument("--warm", action="store_true",
                    help="every prompt already in the prefix cache on every side: the decoding that batching shares")
    ap.add_argument("--fixed-prefill", action="store_true",
                    help="exactly --prefill-chunk while rows decode (the budget before it adapted to the queue)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    engine = ss.SpecStruct.from_pretrained(args.model, draft=args.draft or None)
    drafter = engine.speculator.drafters.get("model")
    if args.rows_alone and drafter is not None:
        drafter.runtime.row_invariant = drafter.runtime.reuses_prefixes = False
    work = extraction_workloads(args.requests)
    work = (work * (args.requests // max(1, len(work)) + 1))[: args.requests]
    # every run sends the same prompts: a cache warmed by one run would favour the later ones, so it is off, or
    # (--warm) warmed with every prompt before any run
    sampling = {"temperature": args.temperature, "seed": args.seed} if args.temperature > 0 else {}
    reqs = requests_for(engine, work, max_new_tokens=args.max_new_tokens, enable_speculative=not args.no_spec,
                        use_prefix_cache=args.warm, **sampling)
    run_requests(engine, reqs if args.warm else reqs[:1], 1)  # warm-up: measures the policy's costs, fills caches
    print(json.dumps({"model": args.model, "draft": args.draft, "numerics": engine.numerics,
                      "speculative": not args.no_spec, "threads": args.threads, "prompts": "cached" if args.warm
                      else "cold", "temperature": args.temperature}), flush=True)
    concurrencies = [int(x) for x in args.concurrency.split(",")]
    if not args.interference_only:
        for out in measure_batch(engine, reqs, concurrencies, prefill_chunk=args.prefill_chunk,
                                 adaptive_prefill=not args.fixed_prefill,
                                 report=lambda run: print(json.dumps(run), flush=True)):
            print(json.dumps(out), flush=True)
    if args.interference or args.interference_only:
        long = Request(reqs[0].ids * 4, reqs[0].constraint, reqs[0].config)
        print(json.dumps({"interference": measure_prefill_interference(
            engine, reqs[1:4], long, prefill_chunk=args.prefill_chunk, adaptive_prefill=not args.fixed_prefill)}),
            flush=True)


if __name__ == "__main__":
    main()
