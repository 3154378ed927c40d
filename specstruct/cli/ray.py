"""The bodies of `specstruct extract --ray` and `specstruct serve --ray`: option checks, then the Ray entry points.
The typer commands call these, importing this module only with --ray, so the CLI never imports ray otherwise."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import typer

from specstruct.cli.support import EXIT_USAGE, fail


def resolve_draft(model: str, draft: Optional[str], no_draft: bool) -> Optional[str]:
    """The draft the CLI uses: --draft, else the registry's default pair when pulled, else none."""
    from specstruct import models

    if draft is not None and no_draft:
        raise fail("--draft and --no-draft exclude each other", EXIT_USAGE)
    if no_draft:
        return None
    if draft is None and model in models.REGISTRY:
        draft = models.REGISTRY[model].default_draft
        if draft and not models.is_pulled(draft):
            return None
    return draft


def run_cli_job(schema: dict[str, Any], input_path: Optional[str], output_path: Optional[str], text: Optional[str],
                model: str, draft: Optional[str], no_draft: bool, max_new_tokens: Optional[int], actors: int,
                system: str, max_input_tokens: int, row_timeout: float) -> None:
    """`specstruct extract --ray`: check the options, run, print a one-line summary on stderr."""
    if text is not None:
        raise fail("--text reads one document; with --ray pass --input FILE.jsonl instead", EXIT_USAGE)
    if not input_path or not output_path:
        raise fail("--ray needs --input FILE.jsonl and --output FILE.jsonl", EXIT_USAGE)
    if not Path(input_path).is_file():
        raise fail(f"--input file {input_path!r} not found", EXIT_USAGE)
    if not Path(output_path).resolve().parent.is_dir():
        raise fail(f"--output {output_path!r}: its folder does not exist; create it first", EXIT_USAGE)
    check_input(input_path, "text")
    check_models_here(model, resolve_draft(model, draft, no_draft))
    from specstruct.extras import require

    for module in ("ray", "pandas", "pyarrow"):  # before a local Ray cluster starts: a missing one is one line
        require(module, "specstruct extract --ray")
    from specstruct.serving.ray.jobs import extract_jsonl

    config = {"max_new_tokens": max_new_tokens} if max_new_tokens else None
    summary = extract_jsonl(input_path, output_path, schema, model=model, draft=resolve_draft(model, draft, no_draft),
                            config=config, system=system, prompt="Text:\n{text}", actors=actors,
                            max_input_tokens=max_input_tokens, row_timeout=row_timeout)
    typer.echo(f"{summary['rows']} rows, {summary['errors']} errors -> {output_path}", err=True)


def check_input(path: str, column: str, lines: int = 100) -> None:
    """The first lines of a JSON-lines input, read here: a file none of whose first `lines` lines is a JSON object
    with the column (not JSON lines, or the wrong field name) fails before Ray starts, with the fix (inside a Ray task
    the message would be lost in a worker's traceback). A single bad line among good ones is that row's error."""
    import itertools
    import json

    first = None
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in itertools.islice((line for line in f if line.strip()), lines):
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                row = exc
            if isinstance(row, dict) and column in row:
                return
            first = row if first is None else first
    if first is None:
        return  # an empty file: zero rows, written as an empty output
    if isinstance(first, json.JSONDecodeError):
        raise fail(f"--input {path}: not JSON lines (first line: {first})", EXIT_USAGE)
    raise fail(f"--input {path}: each line must be a JSON object with a {column!r} field; the first line has "
               f"{sorted(first) if isinstance(first, dict) else type(first).__name__}", EXIT_USAGE)


def check_models_here(*names: Optional[str]) -> None:
    """On a local cluster (no RAY_ADDRESS) the models load from this machine: check them now (ModelNotFoundError,
    exit 4, with the pull command) rather than as an actor that died. A remote cluster's nodes may hold models this
    machine lacks, so there nothing is checked."""
    import os

    # RAY_ADDRESS is Ray's own variable (the cluster ray.init joins), not a specstruct setting: read as Ray reads it
    if os.environ.get("RAY_ADDRESS"):
        return
    from specstruct.models.loading import resolve

    for name in names:
        if name:
            resolve(name)


def serve_on_ray(*, ray: bool, model: str, draft: Optional[str], no_draft: bool, host: str, port: int,
                 api_key: Optional[str], max_batch_size: int, served_model_name: Optional[str], max_queue: int,
                 replicas: int, num_cpus: Optional[float], num_gpus: Optional[float], **options: Any) -> None:
    """`specstruct serve --ray`: the same app and limits as `specstruct serve`, on `replicas` Ray Serve replicas.
    --max-queue becomes Ray's max_queued_requests (503 past it); each replica takes 2 x --max-batch-size."""
    if not ray:
        raise fail("--replicas, --num-cpus and --num-gpus go with --ray", EXIT_USAGE)
    if api_key == "":
        raise fail("--api-key is empty; pass a key or leave it out", EXIT_USAGE)
    from specstruct.serving.openai import ServerLimits
    from specstruct.serving.ray.engines import require_ray

    require_ray()
    check_models_here(model, resolve_draft(model, draft, no_draft))
    from specstruct.serving.ray.serve import build_app, serve_until_interrupted

    limits = ServerLimits.from_options(**options)  # the request limits; Ray's queue takes --max-queue
    app = build_app(model, draft=resolve_draft(model, draft, no_draft), served_model_name=served_model_name or model,
                    api_key=api_key, limits=limits, replicas=replicas, num_cpus=1 if num_cpus is None else num_cpus,
                    num_gpus=num_gpus, max_batch_size=max_batch_size, max_queued_requests=max_queue)
    serve_until_interrupted(app, host=host, port=port, announce=lambda line: typer.echo(line))
