"""`SpecStruct.generate_many`: many prompts through the scheduler at once, results in input order.

A few worker threads keep the engine's batch slots full (each waits on its request; none holds a lock), so a
list of thousands never overflows `max_queue`. A progress bar (tqdm) shows on long lists.
"""

from __future__ import annotations

from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from typing import Any, Sequence

from specstruct.api.inputs import RawPrompt
from specstruct.api.signature import call_keywords, refuse_unknown


def generate_many(engine: Any, prompts: Sequence[Any], output_type: object = None, *, progress: bool = True,
                  return_exceptions: bool = False, **kwargs: Any) -> list[Any]:
    """engine.generate(prompt, output_type, **kwargs) for every prompt, concurrently; a list in input order.
    return_exceptions=True returns each failure as its exception object; otherwise the first failure is
    raised and the prompts not yet started are skipped."""
    from tqdm.auto import tqdm

    if isinstance(prompts, (str, dict, RawPrompt)):
        raise TypeError("generate_many takes a list of prompts; for one prompt call generate, or pass [prompt]")
    known = call_keywords(engine)  # checked before any prompt starts, not once per prompt on the worker threads
    refuse_unknown("generate_many", kwargs, known, f"; it takes run()'s: {', '.join(sorted(known))}")
    prompts = list(prompts)
    if not prompts:
        return []
    cfg = engine.batch_config
    workers = max(1, min(len(prompts), cfg.max_batch_size + max(1, min(cfg.max_queue, cfg.max_batch_size))))
    bar = tqdm(total=len(prompts), desc="generate_many", unit="req", disable=not progress or len(prompts) < 4)

    def one(prompt: object) -> Any:
        try:
            return engine.generate(prompt, output_type, **kwargs)
        finally:
            bar.update(1)

    pool = ThreadPoolExecutor(workers, thread_name_prefix="specstruct-many")
    try:
        with bar:
            futures = [pool.submit(one, p) for p in prompts]
            if not return_exceptions:
                finished, _ = wait(futures, return_when=FIRST_EXCEPTION)
                error = next((e for f in futures if f in finished and (e := f.exception()) is not None), None)
                if error is not None:
                    raise error
            wait(futures)
    except BaseException:  # the first failure, or Ctrl-C: start no more prompts (those running finish)
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown()
    return [f.exception() if f.exception() is not None else f.result() for f in futures]

