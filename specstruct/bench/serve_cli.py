"""`specstruct bench serve`: load-test a running `specstruct serve` (or any OpenAI-compatible server)."""

from __future__ import annotations

import asyncio
import json
from typing import Any, Optional

import typer

app = typer.Typer(add_completion=False, rich_markup_mode="rich", context_settings={"help_option_names": ["-h", "--help"]})


def extraction_jobs(model_name: str, max_tokens: int, limit: int) -> list[Any]:
    """Typed-extraction requests (bench/extraction.py passages) sent as json_schema response formats."""
    from specstruct.bench.serve_load import Job
    from specstruct.bench.workloads import extraction_workloads

    jobs = []
    for w in extraction_workloads(limit):
        schema = w.output_type.model_json_schema()
        jobs.append(Job({"model": model_name, "messages": w.messages, "max_tokens": max_tokens, "temperature": 0,
                         "response_format": {"type": "json_schema",
                                             "json_schema": {"name": w.output_type.__name__, "schema": schema}}},
                        w.validate))
    return jobs


def _fmt(v: Any, scale: float = 1000.0) -> str:
    return "-" if v is None else f"{v * scale:.0f}"


def table(levels: list[dict[str, Any]]) -> str:
    """A Markdown table: one row per concurrency level (latencies in ms)."""
    head = ("| concurrency | requests | errors | cut at max_tokens | invalid | tok/s | req/s | TTFT p50/p95/p99 | "
            "TPOT p50/p95 | ITL p50/p95 | e2e p50/p95/p99 |\n|---|---|---|---|---|---|---|---|---|---|---|\n")
    rows = []
    for r in levels:
        t, p, i, e = r["ttft_s"], r["tpot_s"], r["itl_s"], r["e2e_s"]
        rows.append(f"| {r['concurrency']} | {r['requests']} | {r['errors']} | {r.get('cut', 0)} | {r['invalid']} | "
                    f"{r['tokens_per_s']:.2f} | {r['requests_per_s']:.3f} | "
                    f"{_fmt(t['p50'])}/{_fmt(t['p95'])}/{_fmt(t['p99'])} | {_fmt(p['p50'])}/{_fmt(p['p95'])} | "
                    f"{_fmt(i['p50'])}/{_fmt(i['p95'])} | {_fmt(e['p50'])}/{_fmt(e['p95'])}/{_fmt(e['p99'])} |")
    return head + "\n".join(rows)


def plot(levels: list[dict[str, Any]], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    c = [r["concurrency"] for r in levels]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    a.plot(c, [r["tokens_per_s"] for r in levels], marker="o")
    a.set(xlabel="concurrency", ylabel="output tokens / s", title="throughput")
    for key, label in (("ttft_s", "TTFT p50"), ("e2e_s", "e2e p50")):
        b.plot(c, [r[key]["p50"] for r in levels], marker="o", label=label)
    b.set(xlabel="concurrency", ylabel="seconds", title="latency")
    b.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


@app.command()
def serve(
    base_url: str = typer.Option("http://127.0.0.1:8000/v1", "--base-url", help="The server's /v1 URL."),
    model: str = typer.Option("qwen2.5-coder-1.5b", "--model", help="The served model name to send."),
    concurrency: str = typer.Option("1,4,8,16", "--concurrency", help="Comma-separated concurrency levels."),
    requests: int = typer.Option(16, "--requests", "-n", min=1, help="Requests per concurrency level."),
    rate: Optional[float] = typer.Option(None, "--rate", min=0.001, help="Poisson arrivals (requests/s); "
                                         "default: all at once, capped by the concurrency."),
    max_tokens: int = typer.Option(256, "--max-tokens", min=1),
    prompts: int = typer.Option(8, "--prompts", min=1, help="Distinct extraction prompts to cycle through."),
    api_key: Optional[str] = typer.Option(None, "--api-key", help="The server's key (default: env SPECSTRUCT_API_KEY)."),
    warmup: int = typer.Option(1, "--warmup", min=0, help="Unmeasured requests first (compile the schemas)."),
    out: Optional[str] = typer.Option(None, "--out", help="Write every sample and the summaries as JSON."),
    plot_path: Optional[str] = typer.Option(None, "--plot", help="Write a PNG: throughput and latency."),
) -> None:
    """Load-test a running server with streamed typed-extraction requests (json_schema response format):
    TTFT, TPOT, ITL, end-to-end latency p50/p95/p99, throughput, errors, outputs cut at --max-tokens and invalid
    outputs (finished but failing their schema) per concurrency.

    Example:  specstruct serve &   then   specstruct bench serve --concurrency 1,4,8 --requests 16 --out s.json
    """
    from rich.progress import Progress

    from specstruct.bench.serve_load import run_level
    from specstruct.settings import settings

    api_key = settings().api_key if api_key is None else api_key
    levels = [int(c) for c in concurrency.split(",") if c.strip()]
    jobs = extraction_jobs(model, max_tokens, prompts)
    results = []
    if warmup:
        asyncio.run(run_level(base_url, jobs, 1, max(warmup, len(jobs)), None, api_key))
    with Progress() as bar:
        for c in levels:
            task = bar.add_task(f"concurrency {c}", total=requests)
            results.append(asyncio.run(run_level(base_url, jobs, c, requests, rate, api_key,
                                                 on_done=lambda t=task: bar.advance(t))))
    typer.echo(table(results))
    if out:
        with open(out, "w") as f:
            json.dump({"base_url": base_url, "model": model, "max_tokens": max_tokens, "rate": rate,
                       "levels": results}, f, indent=1)
    if plot_path:
        plot(results, plot_path)
