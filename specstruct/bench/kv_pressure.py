"""KV memory under pressure: N extraction requests at once, with `kv_memory.active_bytes` sized so that the first
`--fit` prompts fit side by side and the running rows outgrow it as they decode. The scheduler must preempt (spill
the newest rows' KV to disk, restore it later), every output must equal the same request run alone, and the
process's peak RSS is reported next to the budgets.

    python -m specstruct.bench.kv_pressure --fit 2 --slack 24    # real pair: 4 requests, the first 2 fit
    python -m specstruct.bench.kv_pressure --tiny --requests 3   # tiny random models (plumbing only)

Prints one JSON object: budget, counts (preemptions, resumes, restored, re-prefilled, spilled tokens), spill and
restore seconds (and per spilled token), tokens/s under pressure vs one at a time, identical outputs, peak RSS.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import threading
import time
from typing import Any, Sequence

MiB = 2**20


def _engine(args: argparse.Namespace, directory: str) -> tuple[Any, list[Any]]:
    import specstruct as ss
    from specstruct.bench.workloads import extraction_workloads

    if args.tiny:
        from specstruct.testing import perturbed, tiny_model, tiny_tokenizer

        tok = tiny_tokenizer()
        target = tiny_model(tok, seed=0)
        draft, name = perturbed(target), "tiny-random-qwen2"
    else:
        from specstruct.models.loading import load

        target, tok = load(args.model)
        draft, name = (load(args.draft)[0] if args.draft else None), args.model
    work = (extraction_workloads(args.requests) * args.requests)[: args.requests]
    config = ss.SpecConfig(max_new_tokens=args.max_new_tokens, max_retries=0, use_prefix_cache=False)
    built = ss.EngineConfig(kv_memory=ss.config.KVMemory(disk_bytes=4 << 30, directory=directory))
    engine = ss.SpecStruct(target, tok, draft_model=draft, config=config, engine_config=built, model_name=name,
                           batch_config={"max_batch_size": max(8, args.requests)})
    prompts = [len(engine.prompt_ids(w.messages, w.output_type)) for w in work]
    budget = engine.scheduler.preemption.budget  # the active tier's budget the scheduler preempts against
    per_token = budget.need(1) - budget.need(0)
    # the first `fit` requests are admitted together; after about `slack` output tokens each they outgrow the tier
    budget.active_bytes = sum(budget.need(n) for n in prompts[: args.fit]) + args.fit * args.slack * per_token
    return engine, work


def measure(engine: Any, work: Sequence[Any]) -> dict[str, Any]:
    from specstruct.bench.measure import generated_ids
    from specstruct.bench.pipeline import peak_rss_mib

    t0 = time.perf_counter()
    alone = [generated_ids(engine, w.messages, w.output_type) for w in work]  # one at a time: each alone always fits
    alone_s = time.perf_counter() - t0
    before = dict(engine.cache_info()["preemption"])
    got: list[list[int]] = [[] for _ in work]
    def one(i: int) -> None:
        got[i] = generated_ids(engine, work[i].messages, work[i].output_type)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(work))]
    t0 = time.perf_counter()
    for t in threads:  # in list order (the budget is sized on the first prompts), all within the batching window
        t.start()
        time.sleep(0.005)
    for t in threads:
        t.join()
    pressed_s = time.perf_counter() - t0
    p = engine.cache_info()["preemption"]
    counts = {k: p[k] - before.get(k, 0) for k in ("preemptions", "resumes", "restored", "reprefilled",
                                                   "spilled_tokens", "spill_s", "restore_s")}
    tokens = sum(map(len, got))
    per_token = counts["spilled_tokens"] or 1
    return {
        "active_bytes_mib": round(engine.scheduler.preemption.budget.active_bytes / MiB, 1), "requests": len(work),
        **{k: round(v, 3) if isinstance(v, float) else v for k, v in counts.items()},
        "spill_ms_per_token": round(1000 * counts["spill_s"] / per_token, 3),
        "restore_ms_per_token": round(1000 * counts["restore_s"] / per_token, 3),
        "spilled_bytes_total": p["store"]["spilled_bytes"], "store_bytes_now": p["store"]["bytes"],
        "tokens": tokens, "pressured_tokens_per_s": round(tokens / pressed_s, 3),
        "one_at_a_time_tokens_per_s": round(sum(map(len, alone)) / alone_s, 3),
        "identical": f"{sum(a == b for a, b in zip(alone, got))}/{len(work)}",
        "peak_rss_mib": round(peak_rss_mib(), 1), "numerics": engine.numerics,
    }


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen2.5-coder-1.5b")
    ap.add_argument("--draft", default="qwen2.5-coder-0.5b", help="'' for none")
    ap.add_argument("--tiny", action="store_true", help="tiny random models (plumbing, not speed)")
    ap.add_argument("--requests", type=int, default=4)
    ap.add_argument("--fit", type=int, default=2, help="about this many prompts fit in the active tier at once")
    ap.add_argument("--slack", type=int, default=24, help="output tokens per admitted row before the tier overflows "
                    "(larger: the newest row is decoding, not still prefilling, when it is paused)")
    ap.add_argument("--max-new-tokens", type=int, default=96)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="specstruct-kv-") as directory:
        engine, work = _engine(args, directory)
        with engine:
            print(json.dumps(measure(engine, work)), flush=True)


if __name__ == "__main__":
    main()
