"""A JSON-lines file in, a JSON-lines file out, through `extract` on a Ray cluster (`specstruct extract --ray`).

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
    target = Path(output_path)
    partial = target.with_name(f".{target.name}.partial")  # a failed job leaves an existing output as it was
    try:
        with open(partial, "w", encoding="utf-8") as f, tqdm(total=total, unit="row", disable=not progress,
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
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    partial.replace(target)
    return {"rows": rows, "errors": errors}

