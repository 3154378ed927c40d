"""The extraction pipeline scenario: one schema, one system prompt, ten passages sent in sequence, each
call once with the prefix cache and once with it disabled (alternating which goes first), on the same engine.

    specstruct bench --scenario pipeline --out pipeline.json --markdown pipeline.md

Reports per call the target prefill time, time to first token and tokens/s, and over the run the end-to-end JSON
tokens/s, whether the outputs are identical, the cache's counters and the peak RSS. It also times what chunked
prefill costs against one block on the same prompt (chunking is what makes cached == cold bitwise)."""

from __future__ import annotations

import resource
import statistics
import sys
import time
from typing import Any, Callable

from specstruct.bench.extraction import PASSAGES, Person, extraction_prompt

SYSTEM = (
    "You are the extraction step of a customer-records pipeline. Each message contains one passage of text about "
    "a single person, taken from emails, news items, CVs or support tickets. Read the passage and fill in the "
    "record exactly as the schema describes. Rules: copy names, cities and email addresses exactly as they are "
    "written, with the same spelling and capitalisation; give the age as a whole number of years only when the "
    "passage states it or it follows directly from a stated birth year and date; describe the occupation in a "
    "few words taken from the passage; use null for an optional field the passage does not mention, and never "
    "guess or invent a value. Answer with the JSON object only, without comments or explanations."
)

MORE_PASSAGES = [
    "Amara Nwosu, 29, works as a data engineer for a logistics start-up in Nairobi. She can be reached at "
    "amara.nwosu@swiftcargo.example.ke for questions about the tracking API.",
    "Our new branch manager in Porto is Rui Carvalho, a 52-year-old former bank auditor. Customers may write "
    "to rui.carvalho@bancodonorte.example.pt.",
    "Yuki Tanaka (38) is a violin maker with a small workshop in Kyoto; she answers commissions by post only.",
    "Support ticket #4471 was opened by Mehmet Demir, a high-school chemistry teacher from Izmir, who wrote "
    "from mehmet.demir@okul.example.tr. He did not give his age.",
    "Sofia Rossi, a 44-year-old architect in Milan, designed the new public library; contact: "
    "s.rossi@studiorossi.example.it.",
    "Liam O'Connor is a 26-year-old paramedic in Cork who volunteers with the mountain rescue team.",
    "From the CV: Priya Raman, born 1990, senior tax consultant, currently living in Bengaluru, "
    "email priya.raman@taxwise.example.in.",
]


def pipeline_passages(limit: int = 10) -> list[str]:
    people = [text for _, model, text in PASSAGES if model is Person]
    return (people + MORE_PASSAGES)[:limit]


def _one(engine: Any, messages: list[dict[str, str]], cached: bool, max_new_tokens: int) -> dict[str, Any]:
    cfg = engine.config.merged(use_prefix_cache=cached, max_new_tokens=max_new_tokens, max_retries=0)
    from specstruct.errors import IncompleteOutputError

    start = time.perf_counter()
    first = None
    try:
        for chunk in engine.stream(messages, Person, config=cfg):
            if first is None:
                first = time.perf_counter() - start
            if chunk.result is not None:
                st, ids, text = chunk.result.stats, chunk.result.token_ids, chunk.result.text
    except IncompleteOutputError as exc:  # cut short by max_new_tokens: still a timing (and a comparison)
        st, ids, text = exc.stats, exc.token_ids, exc.text
    wall = time.perf_counter() - start
    return dict(cached=cached, token_ids=list(ids), text=text, wall_s=wall, ttft_s=first,
                prefill_s=st.prefill_s, prompt_tokens=st.prompt_tokens, cached_prompt_tokens=st.cached_prompt_tokens,
                new_tokens=st.new_tokens, tokens_per_s=st.new_tokens / wall if wall else 0.0,
                target_forwards=st.target_forwards, draft_time_s=st.draft_time_s)


def run_pipeline(engine: Any, limit: int = 10, max_new_tokens: int = 128,
                 progress: Callable[[int, int, str], None] | None = None) -> dict[str, Any]:
    passages = pipeline_passages(limit)
    engine.clear_cache()
    calls: list[dict[str, Any]] = []
    for i, passage in enumerate(passages):
        messages = [{"role": "system", "content": SYSTEM},
                    {"role": "user", "content": extraction_prompt(Person, passage)}]
        order = (True, False) if i % 2 == 0 else (False, True)  # alternate which side runs first
        pair = {}
        for cached in order:
            if progress:
                progress(len(calls), 2 * len(passages), f"passage {i + 1}: {'cache' if cached else 'no cache'}")
            pair[cached] = c = _one(engine, messages, cached, max_new_tokens)
            calls.append(dict(c, passage=i))
            if progress:  # each call's figures as soon as they exist: a long run is useful even if cut short
                progress(len(calls), 2 * len(passages),
                         f"passage {i + 1} {'cache' if cached else 'no cache'}: prefill {c['prefill_s']:.2f} s, "
                         f"ttft {c['ttft_s'] or 0:.2f} s, {c['tokens_per_s']:.2f} tok/s, wall {c['wall_s']:.1f} s, "
                         f"{c['cached_prompt_tokens']}/{c['prompt_tokens']} prompt tokens cached")
        pair[True]["identical"] = pair[True]["token_ids"] == pair[False]["token_ids"]
    if progress:
        progress(len(calls), len(calls), "done")
    return dict(calls=calls, summary=summarize(calls), cache=engine.cache_info(), peak_rss_mib=peak_rss_mib(),
                numerics=getattr(engine, "numerics", ""), model=getattr(engine, "model_name", ""))


def summarize(calls: list[dict[str, Any]]) -> dict[str, Any]:
    def side(cached: bool, skip_first: bool = False) -> list[dict[str, Any]]:
        return [c for c in calls if c["cached"] == cached and not (skip_first and c["passage"] == 0)]

    out: dict[str, Any] = {}
    for name, cached in (("cache", True), ("no_cache", False)):
        rows = side(cached)
        later = side(cached, skip_first=True)
        out[name] = dict(
            e2e_tokens_per_s=sum(c["new_tokens"] for c in rows) / sum(c["wall_s"] for c in rows),
            wall_s=sum(c["wall_s"] for c in rows),
            prefill_s_median=statistics.median(c["prefill_s"] for c in later),
            ttft_s_median=statistics.median(c["ttft_s"] for c in later),
            cached_prompt_tokens_median=statistics.median(c["cached_prompt_tokens"] for c in later),
            prompt_tokens_median=statistics.median(c["prompt_tokens"] for c in rows))
    warm, cold = out["cache"], out["no_cache"]
    out["prefill_speedup"] = cold["prefill_s_median"] / warm["prefill_s_median"]
    out["ttft_speedup"] = cold["ttft_s_median"] / warm["ttft_s_median"]
    out["e2e_speedup"] = warm["e2e_tokens_per_s"] / cold["e2e_tokens_per_s"]
    out["identical"] = all(c.get("identical", True) for c in calls)
    return out


def peak_rss_mib() -> float:
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / 2**20 if sys.platform == "darwin" else rss / 1024


def chunking_cost(runtime: Any, ids: list[int], repeats: int = 3) -> dict[str, Any]:
    """Prefill `ids` cold on the engine's own (row-invariant) runtime, alternating one block and `prefill_chunk`-token
    chunks. Against transformers' stock forward: `python -m benchmarks.forward_cost --prefill N`."""
    from specstruct.testing import OneSequence

    runtime = OneSequence(runtime)  # one sequence over the runtime's packed forward
    times: dict[str, list[float]] = {"one_block": [], "chunked": []}
    for r in range(repeats):
        for how in (("one_block", "chunked") if r % 2 == 0 else ("chunked", "one_block")):
            runtime.start([], 0)
            t0 = time.perf_counter()
            if how == "one_block":
                runtime.extend(ids, last_only=True)
            else:
                runtime.extend_chunked(ids)
            times[how].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) for k, v in times.items()}
    return dict(tokens=len(ids), chunk=runtime.prefill_chunk, repeats=repeats, seconds=times,
                median_s=med, ratio=med["chunked"] / med["one_block"])


def markdown(res: dict[str, Any]) -> str:
    s = res["summary"]
    w, c = s["cache"], s["no_cache"]
    n = len({call["passage"] for call in res["calls"]})
    lines = [
        f"Model: {res['model']}; numerics: {res['numerics']}. Peak RSS {res['peak_rss_mib']:.0f} MiB.",
        "",
        "| | prefix cache on | cache disabled | ratio |",
        "|---|---|---|---|",
        f"| target prefill, median of calls 2-{n} (s) | {w['prefill_s_median']:.2f} | {c['prefill_s_median']:.2f} | "
        f"{s['prefill_speedup']:.1f}x |",
        f"| time to first token, median of calls 2-{n} (s) | {w['ttft_s_median']:.2f} | {c['ttft_s_median']:.2f} | "
        f"{s['ttft_speedup']:.1f}x |",
        f"| end-to-end JSON tokens/s, all {n} calls | {w['e2e_tokens_per_s']:.2f} | {c['e2e_tokens_per_s']:.2f} | "
        f"{s['e2e_speedup']:.2f}x |",
        f"| prompt tokens (median) / from cache (median, calls 2-{n}) | {w['prompt_tokens_median']:.0f} / "
        f"{w['cached_prompt_tokens_median']:.0f} | {c['prompt_tokens_median']:.0f} / 0 | |",
        f"| outputs identical | {s['identical']} | | |",
    ]
    b = res.get("batched")
    if b:
        lines.insert(-1, f"| end-to-end JSON tokens/s, all {n} passages at once (batched) | "
                         f"{b['cache']['tokens_per_s']:.2f} | {b['no_cache']['tokens_per_s']:.2f} | {b['speedup']:.2f}x |")
        lines.insert(-1, f"| batched outputs identical (cache on vs off) | {b['identical']} | | |")
    lc = res.get("llama.cpp")
    if lc:
        lw, lcold = lc["cache"], lc["no_cache"]
        lines += ["", f"llama.cpp ({lc['numerics']}), the same {n} prompts and schema in sequence:", "",
                  "| | specstruct, prefix cache | llama.cpp, prompt cache | ratio | llama.cpp, cache off |",
                  "|---|---|---|---|---|",
                  f"| wall clock, all {n} calls (s) | {w['wall_s']:.2f} | {lw['wall_s']:.2f} | "
                  f"{lw['wall_s'] / w['wall_s']:.2f}x | {lcold['wall_s']:.2f} |",
                  f"| end-to-end JSON tokens/s | {w['e2e_tokens_per_s']:.2f} | {lw['e2e_tokens_per_s']:.2f} | "
                  f"{w['e2e_tokens_per_s'] / lw['e2e_tokens_per_s']:.2f}x | {lcold['e2e_tokens_per_s']:.2f} |",
                  f"| prefill, median of calls 2-{n} (s) | {w['prefill_s_median']:.2f} | {lw['prefill_s_median']:.2f} "
                  f"| {lw['prefill_s_median'] / w['prefill_s_median']:.2f}x | {lcold['prefill_s_median']:.2f} |",
                  f"| valid outputs | {n}/{n} | {lw['valid']}/{n} | | {lcold['valid']}/{n} |",
                  f"| cached output == cold output | {n if s['identical'] else 'not all'}/{n} | {lc['identical']}/{n} "
                  "| | |"]
    o = res.get("outlines")
    if o and "skipped" not in o:
        lines += ["", f"outlines on the same weights ({o['numerics']}), the same {o['calls']} passages one at a time: "
                      f"{o['tokens_per_s']:.2f} tokens/s end to end, {o['valid']}/{o['calls']} valid; specstruct with "
                      f"the prefix cache, in sequence: {w['e2e_tokens_per_s'] / o['tokens_per_s']:.2f}x that"
                      + (f", batched: {b['cache']['tokens_per_s'] / o['tokens_per_s']:.2f}x." if b else ".")]
    elif o:
        lines += ["", f"outlines: {o['skipped']}"]
    if "chunking" in res:
        ch = res["chunking"]
        lines += ["", f"Chunked prefill ({ch['chunk']}-token chunks) vs one block, both row-invariant, "
                      f"{ch['tokens']}-token prompt, target, median of {ch['repeats']} alternating: "
                      f"{ch['median_s']['chunked']:.2f} s vs {ch['median_s']['one_block']:.2f} s = "
                      f"{ch['ratio']:.2f}x."]
    return "\n".join(lines) + "\n"


def main(engine: Any, console: Any, limit: int | None, max_new_tokens: int, out: str | None,
         markdown_out: str | None, progress: Callable[[int, int, str], None] | None,
         others: bool = True, llama: Any = None) -> dict[str, Any]:
    """`specstruct bench --scenario pipeline`: the chunking cost, the pipeline in sequence, then (with `others`)
    the same passages batched and through outlines, and (with a `llama` side) through llama-server; prints the
    Markdown table."""
    from specstruct.bench.report import publish

    messages = [{"role": "system", "content": SYSTEM},
                {"role": "user", "content": extraction_prompt(Person, pipeline_passages(1)[0])}]
    ids = engine.prompt_ids(messages, Person)
    if progress:
        progress(0, 1, f"timing chunked vs one-block prefill of a {len(ids)}-token prompt")
    res: dict[str, Any] = {"chunking": chunking_cost(engine.runtime, ids, repeats=2)}
    if progress:
        progress(0, 1, f"chunked vs one block: {res['chunking']['median_s']} -> {res['chunking']['ratio']:.2f}x")
    res.update(run_pipeline(engine, limit or 10, max_new_tokens, progress))
    if others:
        from specstruct.bench.pipeline_sides import run_batched, run_outlines

        passages = pipeline_passages(limit or 10)
        res["batched"] = run_batched(engine, SYSTEM, passages, max_new_tokens, progress)
        res["outlines"] = run_outlines(engine, SYSTEM, passages, max_new_tokens, progress)
    if llama is not None:
        from specstruct.bench.pipeline_sides import run_llama

        try:
            res["llama.cpp"] = run_llama(llama, engine, SYSTEM, pipeline_passages(limit or 10), max_new_tokens,
                                         progress)
        finally:
            llama.close()
    publish(res, console, out, None, markdown_out, show=lambda r, c: c.print(markdown(r)), render=markdown)
    return res
