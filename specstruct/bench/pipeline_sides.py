"""The pipeline scenario's other two sides: the same passages all at once (batched, through the scheduler) with the
prefix cache on and off, and outlines on the same weights one passage at a time (it keeps no cache across calls).

Both report end-to-end JSON tokens/s (new tokens of all calls / wall time) beside the sequential runs of
pipeline.py, so one run shows the cache in sequence, the cache under batching, and a peer."""

from __future__ import annotations

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
