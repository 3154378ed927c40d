"""Bulk extraction with Ray Data: one engine per actor, whole batches per call, one result row per input row.

    import ray, specstruct.serving.ray as ssr
    ds = ray.data.read_json("docs.jsonl")                       # a column "text"
    out = ssr.extract(ds, Invoice, model="qwen2.5-coder-1.5b", draft="qwen2.5-coder-0.5b", actors=4)
    out.write_json("invoices/")                                  # lazy until written or iterated

A row that fails (validation retries exhausted, output cut by max_new_tokens, prompt too long, text missing) gets
`error` set and `value` null; it never fails the job. Errors that concern the whole job (unknown column, a schema that
cannot compile, a model that cannot load) raise, as they would without Ray.
"""

from __future__ import annotations

import json
from typing import Any, Callable

from specstruct.serving.ray.engines import engine_factory, require_ray, run_batch

RESULT_COLUMNS = ("value", "raw_text", "finish_reason", "error", "error_type", "attempts", "prompt_tokens",
                  "new_tokens", "target_forwards", "acceptance_rate", "tokens_per_forward", "elapsed_s")
_INT_COLUMNS = ("attempts", "prompt_tokens", "new_tokens", "target_forwards")
_FLOAT_COLUMNS = ("acceptance_rate", "tokens_per_forward", "elapsed_s")


class BadInputError(ValueError):
    """One row's input cannot be turned into a prompt (missing, empty or not text)."""


def value_json(value: Any) -> str:
    """The parsed value as JSON text (Pydantic models dumped in JSON mode; str outputs as JSON strings)."""
    from pydantic import BaseModel, TypeAdapter

    if isinstance(value, BaseModel):
        return value.model_dump_json()
    return json.dumps(TypeAdapter(Any).dump_python(value, mode="json"), ensure_ascii=False)


def result_row(outcome: Any) -> dict[str, Any]:
    """The result columns of one row, from a Result or the exception its row raised."""
    row: dict[str, Any] = dict.fromkeys(RESULT_COLUMNS)
    stats = getattr(outcome, "stats", None)
    if isinstance(outcome, BaseException):
        row.update(error=f"{type(outcome).__name__}: {outcome}", error_type=type(outcome).__name__,
                   raw_text=getattr(outcome, "text", None))
        if type(outcome).__name__ == "IncompleteOutputError":  # cut by max_new_tokens: rerun these with more
            row.update(finish_reason="length", attempts=1)
        attempts = getattr(outcome, "attempts", None)
        if attempts:  # ValidationRetryError: the last attempt's text and stats
            row.update(raw_text=attempts[-1].get("text"), attempts=len(attempts))
            stats = attempts[-1].get("stats")
    else:
        row.update(value=value_json(outcome.value), raw_text=outcome.text, finish_reason=outcome.finish_reason,
                   attempts=len(outcome.attempts) + 1)
    if stats is not None:
        row.update(prompt_tokens=stats.prompt_tokens, new_tokens=stats.new_tokens,
                   target_forwards=stats.target_forwards, acceptance_rate=stats.acceptance_rate,
                   tokens_per_forward=stats.tokens_per_forward, elapsed_s=stats.elapsed_s)
    return row


def make_prompt(text: Any, template: str | Callable[[str], Any], system: str | None) -> Any:
    """The chat messages for one row; BadInputError when the row has no usable text."""
    if text is None:
        raise BadInputError("the row has no text (null): fix or drop this row")
    if not isinstance(text, str):
        raise BadInputError(f"the row's text is a {type(text).__name__} ({str(text)[:40]!r}), not a string: fix or "
                            "drop this row")
    if not text.strip():
        raise BadInputError("the row's text is empty: fix or drop this row")
    try:
        user = template(text) if callable(template) else template.replace("{text}", text)
        messages = [{"role": "user", "content": user}] if isinstance(user, str) else list(user)
    except Exception as exc:  # noqa: BLE001 - the user's prompt callable failed on this row: that row's error
        raise BadInputError(f"prompt= raised on this row: {type(exc).__name__}: {exc}") from exc
    return ([{"role": "system", "content": system}] + messages) if system else messages


class Extractor:
    """The Ray Data UDF: builds the engine once (in the actor), then turns each pandas batch into result rows."""

    def __init__(self, factory: Callable[[], Any], output_type: Any, template: str | Callable[[str], Any],
                 column: str, system: str | None):
        self.engine = factory()
        self.output_type, self.template, self.column, self.system = output_type, template, column, system

    def __call__(self, batch):
        import pyarrow as pa

        if self.column not in batch.columns:
            raise KeyError(f"the dataset has no column {self.column!r} (columns: {list(batch.columns)}); pass column=")
        clash = [c for c in RESULT_COLUMNS if c in batch.columns]
        if clash:
            raise ValueError(f"the dataset already has columns {clash}, which extract writes its results into; "
                             "rename them (ds.rename_columns) or drop them")
        outcomes: list[Any] = [None] * len(batch)
        prompts, where = [], []
        texts = batch[self.column].astype(object)
        for i, text in enumerate(texts.where(texts.notna(), None).tolist()):
            try:
                prompts.append(make_prompt(text, self.template, self.system))
                where.append(i)
            except BadInputError as exc:
                outcomes[i] = exc
        for i, outcome in zip(where, run_batch(self.engine, prompts, self.output_type)):
            outcomes[i] = outcome
        rows = [result_row(o) for o in outcomes]
        # Arrow columns with fixed types: a block whose rows all succeeded (error all null) or all failed (value
        # all null) must not get a `null` column, or the blocks of one job cannot be read back as one table.
        out = pa.Table.from_pandas(batch, preserve_index=False)
        for name in RESULT_COLUMNS:
            kind = pa.int64() if name in _INT_COLUMNS else pa.float64() if name in _FLOAT_COLUMNS else pa.large_string()
            out = out.append_column(name, pa.array([r[name] for r in rows], type=kind))
        return out


def extract(dataset: Any, output_type: Any, *, model: str | Callable[[], Any], draft: str | None = None,
            config: dict[str, Any] | None = None, prompt: str | Callable[[str], Any] = "{text}",
            system: str | None = None, column: str = "text", actors: int | tuple[int, int] = 1,
            batch_size: int = 16, num_cpus: float | None = 1, num_gpus: float | None = None,
            preserve_order: bool = True, **map_batches_kwargs: Any):
    """Extract `output_type` from every row of a Ray Dataset; returns a lazy Dataset with the input columns plus
    `value` (JSON text, null on error), `raw_text`, `finish_reason`, `error` / `error_type` (null when the row
    succeeded), `attempts` and the speculation stats `prompt_tokens`, `new_tokens`, `target_forwards`,
    `acceptance_rate`, `tokens_per_forward`, `elapsed_s`.

    dataset      a ray.data.Dataset (or a list of strings / dicts, made into one) with a text column
    output_type  what `SpecStruct.run` takes: a Pydantic model, a JSON schema dict, Regex, Choice, ...
    model        registry name, folder or hub id (loaded on every actor), or a picklable engine factory
    draft, config  the draft model and SpecConfig keys (e.g. {"max_new_tokens": 256}) when model is a name
    prompt       the user message: every "{text}" is replaced by the row's text; or a callable text -> prompt
    system       an extra system message (the schema instruction is added by the engine)
    actors       engines in the pool: N, or (min, max) to autoscale
    batch_size   rows handed to one engine call (decoded concurrently when the engine batches)
    num_cpus, num_gpus  per actor; on CPU, Ray sets each actor's torch threads to num_cpus
    preserve_order  output rows in input order (sets the dataset's DataContext preserve_order)
    map_batches_kwargs  passed to Dataset.map_batches (memory=, runtime_env=, ...)
    """
    from specstruct.constraints import check_spec
    from specstruct.output_types import resolve

    check_spec(resolve(output_type).spec)  # a schema that cannot compile raises here, before any actor loads a model
    ray = require_ray()
    if isinstance(dataset, list):
        dataset = ray.data.from_items([r if isinstance(r, dict) else {column: r} for r in dataset])
    if isinstance(prompt, str) and "{text}" not in prompt:
        raise ValueError(f"prompt={prompt!r} has no '{{text}}' placeholder for the row's text")
    factory = engine_factory(model, draft, config)
    if isinstance(actors, list):
        actors = tuple(actors)
    if not isinstance(actors, (int, tuple)) or isinstance(actors, tuple) and len(actors) != 2:
        raise TypeError(f"actors= takes a number of engines or a (min, max) pair to autoscale, got {actors!r}")
    compute = (ray.data.ActorPoolStrategy(min_size=actors[0], max_size=actors[1]) if isinstance(actors, tuple)
               else ray.data.ActorPoolStrategy(size=actors))
    if num_gpus:
        map_batches_kwargs["num_gpus"] = num_gpus
    out = dataset.map_batches(
        Extractor, fn_constructor_kwargs=dict(factory=factory, output_type=output_type, template=prompt,
                                              column=column, system=system),
        batch_size=batch_size, batch_format="pandas", compute=compute, num_cpus=num_cpus, **map_batches_kwargs)
    if preserve_order:
        out.context.execution_options.preserve_order = True
    return out
