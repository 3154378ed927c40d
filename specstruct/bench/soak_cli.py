"""`specstruct bench soak`: hours of traffic in minutes against `specstruct serve`: concurrent streams, clients that
hang up, hostile requests; reports errors, latency, /health and the server's memory over time."""

from __future__ import annotations

import asyncio
import contextlib
import json
import shlex
import subprocess
import time
from typing import Any, Iterator, Optional

import typer

app = typer.Typer(add_completion=False, rich_markup_mode="rich", context_settings={"help_option_names": ["-h", "--help"]})


@contextlib.contextmanager
def started(command: str, base_url: str, wait_s: float = 600.0) -> Iterator[int]:
    """Run `command` (a server) until the block ends; yields its pid once GET /health answers 200."""
    import httpx

    proc = subprocess.Popen(shlex.split(command))
    health = base_url.rstrip("/").removesuffix("/v1") + "/health"
    try:
        deadline = time.monotonic() + wait_s
        while True:
            if proc.poll() is not None:
                raise typer.BadParameter(f"the server exited with code {proc.returncode} before answering {health}",
                                         param_hint="--start")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(health, timeout=2.0).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise typer.BadParameter(f"no answer from {health} after {wait_s:.0f} s", param_hint="--start")
            time.sleep(1.0)
        yield proc.pid
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


@app.command()
def soak(
    base_url: str = typer.Option("http://127.0.0.1:8000/v1", "--base-url", help="The server's /v1 URL."),
    model: str = typer.Option("qwen2.5-coder-1.5b", "--model", help="The served model name to send."),
    minutes: float = typer.Option(10.0, "--minutes", min=0.01, help="How long to send traffic (after warm-up)."),
    streams: int = typer.Option(32, "--streams", min=1, help="Concurrent clients."),
    hostile_share: float = typer.Option(0.1, "--hostile-share", min=0.0, max=1.0,
                                        help="Share of requests that are hostile (see --hostile)."),
    hangup_share: float = typer.Option(0.1, "--hangup-share", min=0.0, max=1.0,
                                       help="Share of streamed requests whose client hangs up mid-reply."),
    hostile: str = typer.Option("all", "--hostile", help="Comma-separated hostile kinds, 'all' or 'none': "
                                "grammar-loop, backtracking-pattern, huge-grammar, many-stops, many-tools, "
                                "surrogate-property, bad-regex, header-flood (128 MB of headers), "
                                "huge-int-max-tokens, huge-int-seed, huge-int-unknown-field, huge-int-schema-maximum "
                                "(5,000-digit integers), nan-temperature, negative-seed, slow-grammar-compile, "
                                "hostile-tool-schemas."),
    max_tokens: int = typer.Option(128, "--max-tokens", min=1),
    prompts: int = typer.Option(8, "--prompts", min=1, help="Distinct extraction prompts to cycle through."),
    deadline: float = typer.Option(60.0, "--deadline", min=1.0, help="Seconds a hostile request may take."),
    warmup: float = typer.Option(30.0, "--warmup", min=0.0, help="Seconds of normal traffic before measuring RSS."),
    server_pid: Optional[int] = typer.Option(None, "--server-pid", help="The server's pid (this machine), for RSS."),
    start: Optional[str] = typer.Option(None, "--start", help="Start this server command first and stop it after "
                                        "(its pid gives RSS), e.g. \"specstruct serve --port 8000\"."),
    api_key: Optional[str] = typer.Option(None, "--api-key", help="The server's key (default: env SPECSTRUCT_API_KEY)."),
    out: Optional[str] = typer.Option(None, "--out", help="Write the report, with the timeline, as JSON."),
    plot_path: Optional[str] = typer.Option(None, "--plot", help="Write a PNG: RSS and /health latency over time."),
) -> None:
    """Soak a server: STREAMS concurrent clients for MINUTES, each sending streamed typed-extraction requests
    (json_schema), hanging up on some mid-reply, and mixing in hostile requests (grammars that loop, patterns
    that backtrack, 200,000 stop strings, 1,500 tools, ...). Prints per kind of request the statuses, 5xx,
    broken streams, invalid outputs and latency p50/p99; /health's slowest answer; and the server's RSS after
    warm-up, at its peak and at the end. Exits 1 if the server did not hold up (any 5xx, broken or invalid
    reply, a hostile request past --deadline, /health over 2 s, RSS at the end more than 10% above its level
    after warm-up).

    Example:  specstruct bench soak --start "specstruct serve --port 8000" --minutes 10 --streams 32 --plot soak.png
    """
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from specstruct.bench.serve_cli import extraction_jobs
    from specstruct.bench.soak import hostile_bodies, plot, soak as run, table, verdict
    from specstruct.settings import settings

    api_key = settings().api_key if api_key is None else api_key

    kinds = hostile_bodies(model)
    names = list(kinds) if hostile == "all" else [] if hostile == "none" else [n.strip() for n in hostile.split(",")]
    unknown = sorted(set(names) - set(kinds))
    if unknown:
        raise typer.BadParameter(f"unknown hostile kind(s) {', '.join(unknown)}; choose from {', '.join(kinds)}",
                                 param_hint="--hostile")
    jobs = extraction_jobs(model, max_tokens, prompts)
    total = warmup + minutes * 60
    with contextlib.ExitStack() as stack:
        pid = stack.enter_context(started(start, base_url)) if start else server_pid
        with Progress(TextColumn("soak"), BarColumn(), TimeElapsedColumn()) as bar:
            task = bar.add_task("soak", total=total)
            result: dict[str, Any] = asyncio.run(run(
                base_url, jobs, seconds=minutes * 60, streams=streams, api_key=api_key,
                hostile={n: kinds[n] for n in names}, hostile_share=hostile_share if names else 0.0,
                hangup_share=hangup_share, server_pid=pid, warmup_s=warmup, deadline_s=deadline,
                on_tick=lambda t: bar.update(task, completed=min(t, total))))
    typer.echo(table(result))
    problems = verdict(result, deadline)
    if out:
        with open(out, "w") as f:
            json.dump({"base_url": base_url, "model": model, "problems": problems, **result}, f, indent=1)
    if plot_path:
        plot(result, plot_path)
    for p in problems:
        typer.echo(f"problem: {p}", err=True)
    if problems:
        raise typer.Exit(1)
    typer.echo("the server held up: no 5xx, no broken or invalid reply, /health within 2 s, RSS flat")
