"""The pipeline scenario's other sides: the same passages all at once (batched, through the scheduler) with the
prefix cache on and off; outlines on the same weights one passage at a time (it keeps no cache across calls); and,
with `--baselines llama.cpp`, llama-server on the same GGUF in sequence with its prompt cache on and off.

Each reports end-to-end JSON tokens/s (new tokens of all calls / wall time) beside the sequential runs of
pipeline.py, so one run shows the cache in sequence, the cache under batching, and a peer."""

from __future__ import annotations

import statistics
import threading
import time
from typing import Any, Callable

from specstruct.bench.extraction import Person, extraction_prompt
from specstruct.bench.measure import generated_ids

Progress = Callable[[int, int, str], None] | None
WARM_PASSAGE = "Nobody is named in this passage; it only says that the weather in Lisbon was mild."


def messages_for(system: str, passage: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": system}, {"role": "user", "content": extraction_prompt(Person, passage)}]


def run_batched(engine: Any, system: str, passages: list[str], max_new_tokens: int,
                progress: Progress = None) -> dict[str, Any]:
    """Every passage submitted at once, cache on then off. The cache side first makes one untimed call on another
    passage, as an earlier call of a pipeline would: it caches the shared system prompt and schema instruction."""
    out: dict[str, Any] = {}
    for cached in (True, False):
        engine.clear_cache()
        cfg = engine.config.merged(use_prefix_cache=cached, max_new_tokens=max_new_tokens, max_retries=0)
        if cached:
            generated_ids(engine, messages_for(system, WARM_PASSAGE), Person, config=cfg)
        if progress:
            progress(0, 1, f"{len(passages)} passages at once, prefix cache {'on' if cached else 'off'}")
        got: list[list[int]] = [[] for _ in passages]

        def work(i: int, cfg: Any = cfg) -> None:
            got[i] = generated_ids(engine, messages_for(system, passages[i]), Person, config=cfg)

        threads = [threading.Thread(target=work, args=(i,)) for i in range(len(passages))]
        start = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - start
        tokens = sum(map(len, got))
        out["cache" if cached else "no_cache"] = dict(wall_s=wall, tokens=tokens, tokens_per_s=tokens / wall,
                                                      token_ids=got)
    out["speedup"] = out["cache"]["tokens_per_s"] / out["no_cache"]["tokens_per_s"]
    out["identical"] = out["cache"]["token_ids"] == out["no_cache"]["token_ids"]
    return out


def run_outlines(engine: Any, system: str, passages: list[str], max_new_tokens: int,
                 progress: Progress = None) -> dict[str, Any]:
    """outlines 1.x on the same model object, stock transformers numerics, one passage at a time (compiling the
    output type is not timed)."""
    try:
        from specstruct.bench.external import OutlinesSide
        from specstruct.bench.measure import Settings
        from specstruct.bench.workloads import Workload

        side = OutlinesSide(engine, Settings(max_new_tokens=max_new_tokens))
    except ImportError as exc:
        return {"skipped": f"outlines is not installed ({exc}); pip install 'specstruct[bench]'"}
    tokens, wall, valid = 0, 0.0, 0
    for i, passage in enumerate(passages):
        if progress:
            progress(i, len(passages), f"outlines: passage {i + 1}")
        w = Workload("pipeline", "json", "extraction", messages_for(system, passage), Person, Person,
                     lambda text: (None, ""))
        m = side.measure(w)
        tokens, wall = tokens + m.new_tokens, wall + m.elapsed_s
        valid += _valid(m.text)
    return dict(tokens=tokens, wall_s=wall, tokens_per_s=tokens / wall if wall else 0.0, valid=valid,
                calls=len(passages), numerics=side.numerics())


def _valid(text: str) -> bool:
    try:
        Person.model_validate_json(text)
        return True
    except ValueError:
        return False


def run_llama(side: Any, engine: Any, system: str, passages: list[str], max_new_tokens: int,
              progress: Progress = None) -> dict[str, Any]:
    """llama-server on the same GGUF, the same prompt ids and schema, the passages in sequence: first with its
    prompt cache on (`cache_prompt: true`: one slot keeps the previous prompt's KV and reuses the common prefix;
    the server starts empty, so call 1 is cold, as specstruct's is after clear_cache), then with it off. Reports
    each call's wall clock, prefill and tokens, whether each cached output equals its cold one, and validity."""
    from specstruct.bench.llama_cpp import schema_of

    side.start()
    out: dict[str, Any] = {"numerics": side.numerics()}
    for cached in (True, False):
        calls = []
        for i, passage in enumerate(passages):
            if progress:
                progress(i, len(passages), f"llama.cpp, prompt cache {'on' if cached else 'off'}: passage {i + 1}")
            ids = engine.prompt_ids(messages_for(system, passage), Person, max_new_tokens=max_new_tokens)
            body = {"prompt": ids, "n_predict": max_new_tokens, "temperature": 0.0, "seed": 0,
                    "cache_prompt": cached, "return_tokens": True, "json_schema": schema_of(Person)}
            m = side.complete(body)
            calls.append(dict(wall_s=m.elapsed_s, prefill_s=m.times.get("prefill_s"), new_tokens=m.new_tokens,
                              prompt_tokens=len(ids), token_ids=m.token_ids, valid=_valid(m.text)))
        wall = sum(c["wall_s"] for c in calls)
        out["cache" if cached else "no_cache"] = dict(
            calls=calls, wall_s=wall, tokens=sum(c["new_tokens"] for c in calls),
            e2e_tokens_per_s=sum(c["new_tokens"] for c in calls) / wall if wall else 0.0,
            prefill_s_median=statistics.median(c["prefill_s"] or 0.0 for c in calls[1:] or calls),
            valid=sum(c["valid"] for c in calls))
    out["identical"] = sum(a["token_ids"] == b["token_ids"]
                           for a, b in zip(out["cache"]["calls"], out["no_cache"]["calls"]))
    return out
