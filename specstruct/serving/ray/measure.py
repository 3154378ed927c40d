"""Measure bulk extraction on Ray against the engine alone, side by side in one run (a command, not a test):

    python -m specstruct.serving.ray.measure --model qwen2.5-coder-1.5b --draft qwen2.5-coder-0.5b --rows 6 \\
        --actors 1 --cpus 2

For each setting it reports the wall time of the whole job (engine load included), the steady rows/s after the
first batch came back, the engine's own decode seconds (sum of the rows' elapsed_s), the overhead per row (wall
after the first batch minus decode time, per row) and the peak RSS of one Ray worker holding an engine.
"engine alone" loads the same engine in this process with --cpus torch threads and runs the same rows through the
same batch function; "ray xN" runs `extract` with N actors of --cpus/N CPUs each.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from typing import Any

import psutil

SCHEMA = {"type": "object", "additionalProperties": False, "required": ["name", "age"],
          "properties": {"name": {"type": "string", "maxLength": 40}, "age": {"type": "integer"}}}
PEOPLE = [("Ada Lovelace", 36, "London"), ("Grace Hopper", 85, "New York"), ("Alan Turing", 41, "Manchester"),
          ("Katherine Johnson", 101, "Hampton"), ("Edsger Dijkstra", 72, "Nuenen"), ("Barbara Liskov", 84, "Boston"),
          ("Donald Knuth", 86, "Stanford"), ("Frances Allen", 88, "Peru")]
PROMPT = "Extract the person from this text as JSON.\nText: {text}"


def texts(n: int) -> list[str]:
    return [f"{name} lived in {city} and was {age} years old." for name, age, city in
            (PEOPLE[i % len(PEOPLE)] for i in range(n))]


class PeakRSS:
    """Samples the RSS of Ray worker processes (ray::...) every 0.5 s; keeps the largest single one."""

    def __init__(self) -> None:
        self.peak, self._stop = 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            for p in psutil.process_iter(["cmdline", "memory_info"]):
                cmd = " ".join(p.info["cmdline"] or [])
                if "ray::" in cmd and ("MapWorker" in cmd or "Extractor" in cmd or "SpecStruct" in cmd):
                    self.peak = max(self.peak, p.info["memory_info"].rss if p.info["memory_info"] else 0)

    def __enter__(self) -> "PeakRSS":
        self._thread.start()
        return self

    def __exit__(self, *_: Any) -> None:
        self._stop.set()
        self._thread.join()


def summarize(label: str, wall: float, first: float, first_rows: int, decode_s: float, n: int, errors: int,
              rss: int) -> dict[str, Any]:
    steady = (n - first_rows) / (wall - first) if n > first_rows and wall > first else float("nan")
    return {"setting": label, "rows": n, "errors": errors, "wall_s": round(wall, 2), "first_batch_s": round(first, 2),
            "steady_rows_per_s": round(steady, 4), "steady_s_per_row": round(1 / steady, 3) if steady else None,
            "decode_s": round(decode_s, 2), "rows_per_s_end_to_end": round(n / wall, 4),
            "peak_rss_gb": round(rss / 2**30, 2)}


def alone(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from specstruct.serving.ray.engines import Pretrained, run_batch
    from specstruct.serving.ray.extract import make_prompt, result_row

    torch.set_num_threads(args.cpus)
    start = time.perf_counter()
    engine = Pretrained(args.model, args.draft, {"max_new_tokens": args.max_new_tokens})()
    prompts = [make_prompt(t, PROMPT, None) for t in texts(args.rows)]
    rows, first = [], None
    for i in range(0, len(prompts), args.batch_size):
        rows += [result_row(o) for o in run_batch(engine, prompts[i:i + args.batch_size], SCHEMA)]
        first = first or time.perf_counter() - start
    wall = time.perf_counter() - start
    rss = psutil.Process().memory_info().rss
    del engine
    return summarize("engine alone", wall, first, min(args.batch_size, args.rows),
                     sum(r["elapsed_s"] or 0 for r in rows), len(rows), sum(r["error"] is not None for r in rows), rss)


def on_ray(args: argparse.Namespace, actors: int) -> dict[str, Any]:
    import ray

    import specstruct.serving.ray as ssr

    ds = ray.data.from_items([{"text": t} for t in texts(args.rows)], override_num_blocks=args.rows)
    start = time.perf_counter()
    out = ssr.extract(ds, SCHEMA, model=args.model, draft=args.draft, config={"max_new_tokens": args.max_new_tokens},
                      prompt=PROMPT, actors=actors, batch_size=args.batch_size, num_cpus=args.cpus / actors)
    rows, first = [], None
    with PeakRSS() as rss:
        for row in out.iter_rows():
            rows.append(row)
            first = first or time.perf_counter() - start
    wall = time.perf_counter() - start
    if any(r["error"] for r in rows):
        print("first error:", next(r["error"] for r in rows if r["error"]), flush=True)
    return summarize(f"ray x{actors} ({args.cpus / actors:g} CPU each)", wall, first,
                     min(args.batch_size, args.rows), sum(r["elapsed_s"] or 0 for r in rows), len(rows),
                     sum(r["error"] is not None for r in rows), rss.peak)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen2.5-coder-1.5b")
    ap.add_argument("--draft", default=None)
    ap.add_argument("--rows", type=int, default=6)
    ap.add_argument("--batch-size", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--actors", default="1,2", help="comma-separated actor counts to run")
    ap.add_argument("--cpus", type=int, default=2, help="CPUs for the whole job (split among actors)")
    ap.add_argument("--skip-alone", action="store_true")
    args = ap.parse_args()
    import ray

    results = [] if args.skip_alone else [alone(args)]  # first, before Ray's processes share the cores
    if results:
        print(json.dumps(results[-1]), flush=True)
    if args.actors:
        ray.init(num_cpus=args.cpus, include_dashboard=False, log_to_driver=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    for n in (int(a) for a in args.actors.split(",") if a):
        results.append(on_ray(args, n))
        print(json.dumps(results[-1]), flush=True)
    print(f"model={args.model} draft={args.draft} rows={args.rows} batch_size={args.batch_size} "
          f"cpus={args.cpus} machine: {psutil.cpu_count()} cores, load average {psutil.getloadavg()}")


if __name__ == "__main__":
    main()
