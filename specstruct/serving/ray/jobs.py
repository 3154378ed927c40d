"""`specstruct extract --ray`: a JSON-lines file in, a JSON-lines file out, through `extract` on a Ray cluster.

Connects to the cluster named by RAY_ADDRESS (or `ray start --head` on this machine), else starts a local one.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Callable

from specstruct.serving.ray.engines import require_ray
from specstruct.serving.ray.extract import extract


def count_lines(path: Path) -> int:
    with path.open("rb") as f:
        return sum(1 for line in f if line.strip())


def extract_jsonl(input_path: str, output_path: str, output_type: Any, *, model: str | Callable[[], Any],
                  draft: str | None = None, config: dict[str, Any] | None = None, system: str | None = None,
                  prompt: str = "{text}", column: str = "text", actors: int = 1, batch_size: int = 16,
                  progress: bool = True) -> dict[str, int]:
    """Run the job; write one output line per input line, in order (input fields + `value` as JSON + the result
    columns). Returns {"rows": n, "errors": e}. Row errors are recorded in the file, not raised."""
    ray = require_ray()
    source = Path(input_path)
    if not source.is_file():
        raise FileNotFoundError(f"--input {input_path!r} not found")
    total = count_lines(source)
    if not ray.is_initialized():
        ray.init(log_to_driver=False)
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False  # ours below counts rows written; Ray's counts blocks
    ds = ray.data.read_json(str(source.resolve()), lines=True)
    out = extract(ds, output_type, model=model, draft=draft, config=config, system=system, prompt=prompt,
                  column=column, actors=actors, batch_size=batch_size)
    return write_jsonl(out, output_path, total=total, progress=progress)


def write_jsonl(results: Any, output_path: str, *, total: int | None = None, progress: bool = True) -> dict[str, int]:
    """Stream an `extract` result Dataset to a JSON-lines file in order, with a progress bar counting rows (and
    errors). `value` is written as the JSON object itself. Returns {"rows": n, "errors": e}."""
    from tqdm import tqdm

    rows = errors = 0
    with open(output_path, "w", encoding="utf-8") as f, tqdm(total=total, unit="row", disable=not progress,
                                                             file=sys.stderr, desc="extract") as bar:
        for row in results.iter_rows():
            row = dict(row)
            if row.get("value") is not None:
                row["value"] = json.loads(row["value"])
            errors += row.get("error") is not None
            f.write(json.dumps(row, ensure_ascii=False, default=str) + "\n")
            rows += 1
            bar.update(1)
            bar.set_postfix(errors=errors, refresh=False)
    return {"rows": rows, "errors": errors}


def resolve_draft(model: str, draft: str | None, no_draft: bool) -> str | None:
    """The draft the CLI uses: --draft, else the registry's pulled default pair, else none."""
    from specstruct import models

    if no_draft:
        return None
    if draft is None and model in models.REGISTRY:
        draft = models.REGISTRY[model].default_draft
        if draft and not models.is_pulled(draft):
            return None
    return draft


def run_cli_job(schema: dict[str, Any], input_path: str | None, output_path: str | None, text: str | None,
                model: str, draft: str | None, no_draft: bool, max_new_tokens: int | None, actors: int,
                system: str) -> None:
    """The body of `specstruct extract --ray`: check the options, run, print a one-line summary on stderr."""
    import typer

    from specstruct.cli.support import EXIT_USAGE, fail

    if text is not None:
        raise fail("--text reads one document; with --ray pass --input FILE.jsonl instead", EXIT_USAGE)
    if not input_path or not output_path:
        raise fail("--ray needs --input FILE.jsonl and --output FILE.jsonl", EXIT_USAGE)
    if draft is not None and no_draft:
        raise fail("--draft and --no-draft exclude each other", EXIT_USAGE)
    if not Path(input_path).is_file():
        raise fail(f"--input file {input_path!r} not found", EXIT_USAGE)
    config = {"max_new_tokens": max_new_tokens} if max_new_tokens else None
    summary = extract_jsonl(input_path, output_path, schema, model=model, draft=resolve_draft(model, draft, no_draft),
                            config=config, system=system, prompt="Text:\n{text}", actors=actors)
    typer.echo(f"{summary['rows']} rows, {summary['errors']} errors -> {output_path}", err=True)
