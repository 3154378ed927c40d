"""`specstruct bench --scenario batch`: many extraction requests at once through one engine.

For each concurrency C, C typed-extraction requests arrive together (t = 0) and four sides serve them:

    batched      the engine's scheduler, speculation on (every request submitted from its own thread)
    one-by-one   the same engine, the same requests one at a time, speculation on
    no-spec      the scheduler, speculation off (batched plain constrained decoding)
    hf-static    transformers `generate` on the same weights, one left-padded batch of C, unconstrained

The prefix cache is off on every side (the same prompts run on each side in turn). Figures per side: total
tokens/s (all new tokens / wall time), per-request latency p50/p95 (completion time since the common arrival),
tokens per scheduler pass. Ratios are batched / side, measured side by side in one run; `identical` says whether
every batched output equals its one-by-one output token for token.
"""

from __future__ import annotations

import statistics
import threading
import time
from typing import Any, Callable

from specstruct.bench.measure import Settings, chat_ids, prompt_messages
from specstruct.bench.workloads import Workload, extraction_workloads

SIDES = ("batched", "one-by-one", "no-spec", "hf-static")


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def _one(engine: Any, w: Workload, config: Any, s: Settings) -> tuple[list[int], str | None]:
    """Token ids of one request (kept when max_new_tokens or validation cuts it short: still decoding work)."""
    from specstruct.errors import IncompleteOutputError, ValidationRetryError

    try:
        res = engine.run(w.messages, w.output_type, max_new_tokens=s.max_new_tokens, temperature=s.temperature,
                         top_p=s.top_p, seed=s.seed, config=config)
        return list(res.token_ids), None
    except IncompleteOutputError as exc:
        return list(exc.token_ids), "incomplete"
    except ValidationRetryError as exc:
        return [0] * int(getattr(exc.attempts[-1]["stats"], "new_tokens", 0)), "invalid"


def _engine_side(engine: Any, wls: list[Workload], config: Any, s: Settings, concurrent: bool) -> dict[str, Any]:
    from specstruct.runtime.openmp import release_pool

    release_pool()  # the requests come from other threads: this one's OpenMP pool would slow the decode thread
    done: list[float] = [0.0] * len(wls)
    outs: list[Any] = [None] * len(wls)
    passes = engine.scheduler.passes
    start = time.perf_counter()

    def work(i: int) -> None:
        outs[i] = _one(engine, wls[i], config, s)
        done[i] = time.perf_counter() - start

    if concurrent:
        threads = [threading.Thread(target=work, args=(i,)) for i in range(len(wls))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    else:
        for i in range(len(wls)):
            work(i)
    wall = time.perf_counter() - start
    tokens = sum(len(ids) for ids, _ in outs)
    passes = engine.scheduler.passes - passes
    return {"wall_s": wall, "tokens": tokens, "tokens_per_s": tokens / wall, "latency_p50_s": statistics.median(done),
            "latency_p95_s": _percentile(done, 0.95), "passes": passes,
            "tokens_per_pass": tokens / passes if passes else None,
            "errors": [e for _, e in outs if e], "outputs": [ids for ids, _ in outs]}


def _hf_static(engine: Any, wls: list[Workload], s: Settings) -> dict[str, Any]:
    """One left-padded `generate` call for all C prompts, unconstrained, transformers' stock numerics."""
    import torch

    from specstruct.bench.external import _generate_kwargs, eos_ids, stock_numerics

    tok, model, eos = engine.tokenizer, engine.model, eos_ids(engine)
    ids = [chat_ids(tok, prompt_messages(engine, w)) for w in wls]
    width = max(map(len, ids))
    pad = tok.pad_token_id if tok.pad_token_id is not None else eos[0]
    input_ids = torch.tensor([[pad] * (width - len(r)) + r for r in ids])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in ids])
    torch.manual_seed(s.seed)
    with stock_numerics(model), torch.inference_mode():
        start = time.perf_counter()
        out = model.generate(input_ids, attention_mask=mask, **_generate_kwargs(tok, eos, s))
        wall = time.perf_counter() - start
    tokens = 0
    for row in out[:, width:].tolist():
        ends = [i for i, t in enumerate(row) if t in eos]
        tokens += ends[0] + 1 if ends else len(row)
    return {"wall_s": wall, "tokens": tokens, "tokens_per_s": tokens / wall, "latency_p50_s": wall,
            "latency_p95_s": wall, "passes": out.shape[1] - width, "tokens_per_pass": None, "errors": [],
            "outputs": None}


def run_batch_benchmark(engine: Any, concurrencies: list[int], *, settings: Settings | None = None,
                        sides: tuple[str, ...] = SIDES,
                        progress: Callable[[int, int, str], None] | None = None,
                        on_level: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Every side at every concurrency; returns {"meta", "levels": [{concurrency, sides, ratios, identical}]}.
    `on_level` gets the results so far after each level (to save partial results of a long run)."""
    from specstruct.bench.runner import machine_info

    s = settings or Settings()
    # The prefix cache is off on every side: the same prompts run on each side in turn, so a warm cache would
    # serve whichever side runs second (the pipeline scenario measures the cache).
    base = engine.config.merged(max_retries=0, use_prefix_cache=False)
    spec, plain = base.merged(enable_speculative=True), base.merged(enable_speculative=False)
    pool = extraction_workloads(100)
    machine, levels = machine_info(), []
    for c in concurrencies:
        if c > engine.batch_config.max_batch_size:
            raise ValueError(f"concurrency {c} exceeds the engine's max_batch_size "
                             f"{engine.batch_config.max_batch_size}")
    steps, step = len(concurrencies) * len(sides), 0
    _one(engine, pool[0], spec, s)  # warm-up, untimed: first-call costs (allocations, caches) time no side
    for c in concurrencies:
        wls = [pool[i % len(pool)] for i in range(c)]
        for w in wls:
            engine.constraint(w.output_type)  # compiled before any clock starts
        level: dict[str, Any] = {"concurrency": c, "sides": {}}
        runs = {"batched": lambda: _engine_side(engine, wls, spec, s, True),
                "one-by-one": lambda: _engine_side(engine, wls, spec, s, False),
                "no-spec": lambda: _engine_side(engine, wls, plain, s, True),
                "hf-static": lambda: _hf_static(engine, wls, s)}
        for name in sides:
            if progress:
                progress(step, steps, f"concurrency {c}: {name}")
            level["sides"][name] = runs[name]()
            step += 1
        got = level["sides"]
        b = got.get("batched")
        level["ratios"] = {n: b["tokens_per_s"] / r["tokens_per_s"] for n, r in got.items()
                           if b and n != "batched" and r["tokens_per_s"] > 0}
        if b and "one-by-one" in got:
            level["identical"] = b["outputs"] == got["one-by-one"]["outputs"]
        for r in got.values():
            r.pop("outputs", None)
        levels.append(level)
        if on_level:
            on_level({"scenario": "batch", "meta": _meta(engine, s, machine), "levels": levels})
    if progress:
        progress(steps, steps, "done")
    return {"scenario": "batch", "meta": _meta(engine, s, machine), "levels": levels}


def _meta(engine: Any, s: Settings, machine: dict[str, Any]) -> dict[str, Any]:
    import os

    from specstruct.bench.fairness import engine_numerics

    draft = getattr(getattr(engine.draft_model, "config", None), "_name_or_path", None)
    if draft and os.path.isabs(str(draft)):  # a local folder: its name, not this machine's path
        draft = os.path.basename(str(draft).rstrip("/"))
    meta = {"models": {"target": engine.model_name, "draft": str(draft) if draft else None},
            "numerics": engine_numerics(engine), "decoder": type(engine.scheduler.decoder).__name__,
            "batch_config": engine.batch_config.model_dump(), "settings": vars(s), "prefix_cache": "off on every side",
            "machine": {**machine, "load_average_1m_end": round(os.getloadavg()[0], 2)}}
    return meta


def run_batch_cli(engine: Any, concurrency: str, settings: Settings, console: Any, *, quiet: bool,
                  out: str | None, plot_path: str | None, markdown_out: str | None) -> None:
    """What `specstruct bench --scenario batch` does once the engine is loaded."""
    from specstruct.bench.batch_report import batch_markdown, batch_plot, print_batch_report
    from specstruct.bench.report import publish, write_json

    levels = parse_concurrency(concurrency)
    save = (lambda partial: write_json(partial, out)) if out else None  # noqa: E731
    if quiet:
        results = run_batch_benchmark(engine, levels, settings=settings, on_level=save)
    else:
        from rich.progress import Progress

        with Progress(console=console) as bar:
            task = bar.add_task("batch", total=None)
            results = run_batch_benchmark(engine, levels, settings=settings, on_level=save,
                                          progress=lambda d, t, desc: bar.update(task, completed=d, total=t,
                                                                                 description=desc))
    publish(results, console, out, plot_path, markdown_out, show=print_batch_report, draw=batch_plot,
            render=batch_markdown)


def parse_concurrency(text: str) -> list[int]:
    """"1,2,4,8" -> [1, 2, 4, 8] (each at least 1)."""
    try:
        levels = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        levels = []
    if not levels or min(levels) < 1:
        raise ValueError(f"--concurrency {text!r}: give comma-separated request counts, e.g. 1,2,4,8")
    return levels
