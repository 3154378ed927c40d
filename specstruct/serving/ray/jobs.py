"""A JSON-lines file in, a JSON-lines file out, on a Ray cluster (`specstruct extract --ray`), row by row.

Connects to the cluster named by RAY_ADDRESS (or `ray start --head` on this machine), else starts a local one. The
driver reads the file and hands each row to one of `actors` engines (Ray actors, each running as many rows at once as
its engine decodes together), so every row comes back, is written and is counted by the progress bar as it
finishes: a slow row holds no other. A line that is not a JSON object, or lacks the text field, is an error row at
once, without a model; a row past a per-row limit (RowLimits) is one as soon as it is tokenized. The rows land in a
hidden partial file as they finish and the output is then written in input order.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Callable, Iterator

from specstruct.serving.ray.engines import engine_factory, require_ray
from specstruct.serving.ray.extract import (DEFAULT_MAX_INPUT_TOKENS, DEFAULT_ROW_TIMEOUT_S, RESULT_COLUMNS,
                                            BadInputError, RowLimits, make_prompt, result_row, run_row)


def count_lines(path: Path) -> int:
    with path.open("rb") as f:
        return sum(1 for line in f if line.strip())


class RowWorker:
    """One engine in a Ray actor; `run` is one row (called from as many threads as the engine decodes together)."""

    def __init__(self, factory: Callable[[], Any], output_type: Any, template: Any, column: str, system: str | None,
                 limits: RowLimits):
        self.engine = factory()
        self.output_type, self.template, self.column, self.system, self.limits = (output_type, template, column,
                                                                                 system, limits)

    def slots(self, most: int) -> int:
        """Rows to keep in flight here: what the engine decodes together (more would wait in its queue, on the
        row's clock), at most `most`."""
        batch = getattr(self.engine, "batch_config", None)
        return max(1, min(most, batch.max_batch_size if batch is not None else 1))

    def run(self, index: int, record: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        outcome = run_row(self.engine, record.get(self.column), self.template, self.system, self.output_type,
                          self.limits)
        return index, {**record, **result_row(outcome)}


def read_rows(path: Path, column: str, template: Any, system: str | None
              ) -> Iterator[tuple[int, dict[str, Any], BaseException | None]]:
    """(index, record, error) per non-empty line; error is set for a line that cannot become a prompt."""
    with path.open(encoding="utf-8", errors="replace") as f:
        index = 0
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            yield (index, *parse_row(line, number, column, template, system))
            index += 1


def parse_row(line: str, number: int, column: str, template: Any, system: str | None
              ) -> tuple[dict[str, Any], BaseException | None]:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as exc:
        return {}, BadInputError(f"line {number} is not a JSON object ({exc}): fix or drop it")
    if not isinstance(record, dict):
        return {}, BadInputError(f"line {number} is not a JSON object but a {type(record).__name__}: fix or drop it")
    clash = sorted(c for c in RESULT_COLUMNS if c in record)
    if clash:
        return {}, BadInputError(f"line {number} has fields {clash}, which extract writes its results into: rename "
                                 "them")
    if column not in record:
        return record, BadInputError(f"line {number} has no {column!r} field (fields: {sorted(record)[:10]}): fix or "
                                     "drop it")
    try:
        make_prompt(record[column], template, system)
    except BadInputError as exc:
        return record, exc
    return record, None


def extract_jsonl(input_path: str, output_path: str, output_type: Any, *, model: str | Callable[[], Any],
                  draft: str | None = None, config: dict[str, Any] | None = None, system: str | None = None,
                  prompt: str = "{text}", column: str = "text", actors: int = 1, batch_size: int = 16,
                  max_input_tokens: int | None = DEFAULT_MAX_INPUT_TOKENS,
                  row_timeout: float | None = DEFAULT_ROW_TIMEOUT_S, num_cpus: float = 1,
                  num_gpus: float | None = None, progress: bool = True,
                  on_row: Callable[[dict[str, Any]], None] | None = None) -> dict[str, int]:
    """Run the job; write one output line per input line, in input order (input fields + `value` as JSON + the
    result columns). Returns {"rows": n, "errors": e}. Row errors are recorded in the file, not raised.

    batch_size  most rows in flight per engine (also capped by what the engine decodes together)
    max_input_tokens, row_timeout  per-row limits (RowLimits; None or 0: none)
    on_row      called with each row (as written, `value` an object) as it finishes, in finishing order"""
    ray = require_ray()
    source = Path(input_path)
    if not source.is_file():
        raise FileNotFoundError(f"--input {input_path!r} not found")
    from specstruct.constraints import check_spec
    from specstruct.types.output import resolve

    check_spec(resolve(output_type).spec)  # a schema that cannot compile raises before any actor loads a model
    limits = RowLimits(max_input_tokens, row_timeout)
    total = count_lines(source)
    if not ray.is_initialized():
        ray.init(log_to_driver=False)
    actor = ray.remote(RowWorker).options(num_cpus=num_cpus, num_gpus=num_gpus, max_concurrency=batch_size + 1)
    factory = engine_factory(model, draft, config)
    workers = [actor.remote(factory, output_type, prompt, column, system, limits) for _ in range(max(1, actors))]
    try:
        free = ray.get([w.slots.remote(batch_size) for w in workers])  # an engine that cannot load raises here
        with RowWriter(output_path, total, progress, on_row) as out:
            running: dict[Any, int] = {}  # ObjectRef -> worker

            def collect(wait: bool = True) -> None:  # write the rows that have finished (wait for one if `wait`)
                done, _ = ray.wait(list(running), num_returns=1 if wait else len(running), timeout=None if wait else 0)
                for ref in done:
                    free[running.pop(ref)] += 1
                    out.write(*ray.get(ref))

            for index, record, error in read_rows(source, column, prompt, system):
                if error is not None:
                    out.write(index, {**record, **result_row(error)})
                    continue
                while not any(free):
                    collect()
                w = max(range(len(free)), key=free.__getitem__)
                free[w] -= 1
                running[workers[w].run.remote(index, record)] = w
                collect(wait=False)  # rows that finished while this one was read are written now, not at the next wait
            while running:
                collect()
        return out.summary
    finally:
        for w in workers:
            ray.kill(w)


def json_line(row: dict[str, Any]) -> str:
    """One output line: `value` (JSON text in the result columns) written as the JSON value itself."""
    row = dict(row)
    if row.get("value") is not None:
        row["value"] = json.loads(row["value"])
    return json.dumps(row, ensure_ascii=False, default=str)


class RowWriter:
    """Rows written to a hidden partial file as they finish (with a progress bar counting them and the errors),
    then the output written from it in input order; a failed job removes the partial and leaves an existing
    output as it was."""

    def __init__(self, output_path: str, total: int | None, progress: bool,
                 on_row: Callable[[dict[str, Any]], None] | None = None):
        from tqdm import tqdm

        self.target = Path(output_path)
        self.partial = self.target.with_name(f".{self.target.name}.partial")
        self.ordered = self.target.with_name(f".{self.target.name}.ordered")
        self.bar = tqdm(total=total, unit="row", disable=not progress, file=sys.stderr, desc="extract")
        self.on_row, self.spans, self.errors = on_row, {}, 0
        self.file = open(self.partial, "w+b")

    def write(self, index: int, row: dict[str, Any]) -> None:
        line = (json_line(row) + "\n").encode("utf-8")
        self.spans[index] = (self.file.tell(), len(line))
        self.file.write(line)
        self.errors += row.get("error") is not None
        self.bar.update(1)
        self.bar.set_postfix(errors=self.errors, refresh=False)
        if self.on_row is not None:
            self.on_row(json.loads(line))

    @property
    def summary(self) -> dict[str, int]:
        return {"rows": len(self.spans), "errors": self.errors}

    def __enter__(self) -> "RowWriter":
        return self

    def __exit__(self, kind, exc, tb) -> None:
        self.bar.close()
        try:
            if kind is None:
                with open(self.ordered, "wb") as out:
                    for index in sorted(self.spans):
                        start, size = self.spans[index]
                        self.file.seek(start)
                        out.write(self.file.read(size))
                self.ordered.replace(self.target)
        finally:
            self.file.close()
            self.partial.unlink(missing_ok=True)
            self.ordered.unlink(missing_ok=True)


def write_jsonl(results: Any, output_path: str, *, total: int | None = None, progress: bool = True) -> dict[str, int]:
    """Stream an `extract` result Dataset to a JSON-lines file in its order, with a progress bar counting rows (and
    errors). `value` is written as the JSON object itself. Returns {"rows": n, "errors": e}."""
    with RowWriter(output_path, total, progress) as out:
        for index, row in enumerate(results.iter_rows()):
            out.write(index, dict(row))
    return out.summary
