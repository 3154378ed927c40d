"""Bulk extraction with Ray Data: one engine per actor, whole batches per call, one result row per input row.

    import ray, specstruct.serving.ray as ssr
    ds = ray.data.read_json("docs.jsonl")                       # a column "text"
    out = ssr.extract(ds, Invoice, model="qwen2.5-coder-1.5b", draft="qwen2.5-coder-0.5b", actors=4)
    out.write_json("invoices/")                                  # lazy until written or iterated

A row that fails (validation retries exhausted, output cut by max_new_tokens, prompt past the model's window, text
missing) gets `error` set and `value` null; it never fails the job. So does a row past a per-row limit (RowLimits:
`max_input_tokens`, `row_timeout`), at once: one long document cannot stall its batch for hours. Errors that concern
the whole job (unknown column, a schema that cannot compile, a model that cannot load) raise, as they would without
Ray.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable

from specstruct.serving.ray.engines import engine_factory, require_ray, run_each

RESULT_COLUMNS = ("value", "raw_text", "finish_reason", "error", "error_type", "attempts", "prompt_tokens",
                  "new_tokens", "target_forwards", "acceptance_rate", "tokens_per_forward", "elapsed_s")
_INT_COLUMNS = ("attempts", "prompt_tokens", "new_tokens", "target_forwards")
_FLOAT_COLUMNS = ("acceptance_rate", "tokens_per_forward", "elapsed_s")


DEFAULT_MAX_INPUT_TOKENS = 8192  # a CPU prefills this in well under a minute; a GPU, in a blink
DEFAULT_ROW_TIMEOUT_S = 300.0


class BadInputError(ValueError):
    """One row's input cannot be turned into a prompt (missing, empty or not text)."""


class RowLimitError(ValueError):
    """One row is past a per-row limit (its prompt's tokens, its seconds); the message names the limit and its flag."""

    def __init__(self, message: str, prompt_tokens: int | None = None):
        super().__init__(message)
        self.prompt_tokens = prompt_tokens


@dataclass(frozen=True)
class RowLimits:
    """What one row may cost. A row past a limit is an error row (RowLimitError), never a stall of the job.

    max_input_tokens  the row's whole prompt (system message, schema instruction, template, text) in tokens; a
                      longer row is refused before it reaches the model (the model's window applies as well)
    row_timeout       seconds one row may take, queue and decoding and retries together; then it is cancelled
    None or 0: no limit."""

    max_input_tokens: int | None = DEFAULT_MAX_INPUT_TOKENS
    row_timeout: float | None = DEFAULT_ROW_TIMEOUT_S

    def __post_init__(self):
        for name, flag in (("max_input_tokens", "--max-input-tokens"), ("row_timeout", "--row-timeout")):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0):
                raise ValueError(f"{name}={value!r} ({flag}): give a number >= 0 (0 or None: no limit)")


def run_row(engine: Any, text: Any, template: str | Callable[[str], Any], system: str | None, output_type: Any,
            limits: RowLimits) -> Any:
    """One row on the engine: its Result, or the exception that becomes its error row (never raised)."""
    from specstruct.errors import RequestTimeoutError

    tokens = None
    try:
        prompt = make_prompt(text, template, system)
        tokens = check_tokens(engine, prompt, output_type, limits)
        return engine.run(prompt, output_type, timeout=limits.row_timeout or None)
    except RequestTimeoutError:
        return timeout_error(limits, tokens)
    except Exception as exc:  # noqa: BLE001 - recorded as this row's error
        return exc


def check_tokens(engine: Any, prompt: Any, output_type: Any, limits: RowLimits, system: str | None = None) -> int:
    """The prompt's tokens; RowLimitError past max_input_tokens (PromptTooLongError past the model's window)."""
    tokens = len(engine.prompt_ids(prompt, output_type, system=system))
    limit = limits.max_input_tokens
    if limit and tokens > limit:
        raise RowLimitError(f"the row's prompt has {tokens} tokens, past the limit of {limit} (--max-input-tokens "
                            f"{limit}; max_input_tokens={limit} in Python): shorten or split the text, or raise the "
                            "limit", tokens)
    return tokens


def timeout_error(limits: RowLimits, tokens: int | None = None) -> RowLimitError:
    seconds = limits.row_timeout
    return RowLimitError(f"the row ran past its time limit of {seconds:g} s (--row-timeout {seconds:g}; "
                         f"row_timeout={seconds:g} in Python) and was cancelled: raise the limit, or shorten the text "
                         "or max_new_tokens", tokens)


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
        row.update(prompt_tokens=getattr(outcome, "prompt_tokens", None))
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
                 column: str, system: str | None, limits: RowLimits = RowLimits()):
        self.engine = factory()
        self.output_type, self.template, self.column, self.system = output_type, template, column, system
        self.limits = limits

    def __call__(self, batch):
        import pyarrow as pa

        if self.column not in batch.columns:
            raise KeyError(f"the dataset has no column {self.column!r} (columns: {list(batch.columns)}); pass column=")
        clash = [c for c in RESULT_COLUMNS if c in batch.columns]
        if clash:
            raise ValueError(f"the dataset already has columns {clash}, which extract writes its results into; "
                             "rename them (ds.rename_columns) or drop them")
        texts = batch[self.column].astype(object)
        outcomes = run_each(self.engine, texts.where(texts.notna(), None).tolist(), lambda text: run_row(
            self.engine, text, self.template, self.system, self.output_type, self.limits))
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
            preserve_order: bool = True, max_input_tokens: int | None = DEFAULT_MAX_INPUT_TOKENS,
            row_timeout: float | None = DEFAULT_ROW_TIMEOUT_S, **map_batches_kwargs: Any):
    """Extract `output_type` from every row of a Ray Dataset; returns a lazy Dataset with the input columns plus
    `value` (JSON text, null on error), `raw_text`, `finish_reason`, `error` / `error_type` (null when the row
    succeeded), `attempts` and the speculation stats `prompt_tokens`, `new_tokens`, `target_forwards`,
    `acceptance_rate`, `tokens_per_forward`, `elapsed_s`.

    dataset      a ray.data.Dataset (or a list of strings / dicts, made into one) with a text column
    output_type  what `SpecStruct.run` takes: a Pydantic model, a JSON schema dict, Regex, Choice, ...
    model        registry name, folder or hub id (loaded on every actor), or a picklable engine factory
    draft, config  the draft model, and keys of SpecConfig or EngineConfig (e.g. {"max_new_tokens": 256}) when
                 model is a name
    prompt       the user message: every "{text}" is replaced by the row's text; or a callable text -> prompt
    system       an extra system message (the schema instruction is added by the engine)
    actors       engines in the pool: N, or (min, max) to autoscale
    batch_size   rows handed to one engine call (decoded concurrently when the engine batches)
    num_cpus, num_gpus  per actor; on CPU, Ray sets each actor's torch threads to num_cpus
    preserve_order  output rows in input order (sets the dataset's DataContext preserve_order)
    max_input_tokens, row_timeout  per-row limits (RowLimits; None or 0: none): a row past one is an error row
    A batch's rows come back together: for rows written as each finishes, use `extract_jsonl` (jobs.py)
    map_batches_kwargs  passed to Dataset.map_batches (memory=, runtime_env=, ...)
    """
    from specstruct.constraints import check_spec
    from specstruct.types.output import resolve

    check_spec(resolve(output_type).spec)  # a schema that cannot compile raises here, before any actor loads a model
    limits = RowLimits(max_input_tokens, row_timeout)
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
                                              column=column, system=system, limits=limits),
        batch_size=batch_size, batch_format="pandas", compute=compute, num_cpus=num_cpus, **map_batches_kwargs)
    if preserve_order:
        out.context.execution_options.preserve_order = True
    return out
