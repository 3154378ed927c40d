"""How a Ray worker gets its engine, and how it feeds the engine a whole batch.

A Ray actor or Serve replica is started from a pickled description, so the engine is described by a *factory*: a
picklable callable that returns a SpecStruct. `Pretrained` is the one users need (a model name, folder or hub id, an
optional draft, and keys of SpecConfig or EngineConfig in one dict); any other module-level function or class
instance returning a SpecStruct works too (tests pass one that builds tiny offline models)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Protocol, Sequence, runtime_checkable

INSTALL_HINT = 'Ray is not installed: pip install "specstruct[ray]"'


def require_ray():
    """Import ray, or raise ImportError that says how to install it."""
    try:
        import ray
    except ImportError as exc:
        raise ImportError(INSTALL_HINT) from exc
    return ray


@runtime_checkable
class EngineFactory(Protocol):
    """A picklable callable that builds one engine; called once per Ray actor or Serve replica."""

    def __call__(self) -> Any: ...


@dataclass(frozen=True)
class Pretrained:
    """`SpecStruct.from_pretrained(model, draft, decoding_params=config)` on the worker: registry name, local folder,
    .gguf file or hub id. The model must be reachable from every node (pulled there, or on a shared filesystem)."""

    model: str
    draft: str | None = None
    config: dict[str, Any] = field(default_factory=dict)
    batch: dict[str, Any] = field(default_factory=dict)  # BatchConfig keys, for engines that batch

    def __call__(self):
        from specstruct.api.specstruct import SpecStruct

        import inspect

        batching = "batch_config" in inspect.signature(SpecStruct.from_pretrained).parameters
        kwargs = {"batch_config": dict(self.batch)} if self.batch and batching else {}
        return SpecStruct.from_pretrained(self.model, draft=self.draft, decoding_params=dict(self.config), **kwargs)

    @property
    def name(self) -> str:
        return self.model


def engine_factory(model: str | Callable[[], Any], draft: str | None = None,
                   config: dict[str, Any] | None = None) -> Callable[[], Any]:
    """A model name becomes `Pretrained(model, draft, config)`; a callable is returned as it is."""
    if callable(model):
        if draft is not None or config:
            raise ValueError("draft= and config= go with a model name; an engine factory builds its own engine")
        return model
    if not isinstance(model, str) or not model:
        raise TypeError(f"model must be a model name/folder or an engine factory (a callable), got {model!r}")
    return Pretrained(model, draft, dict(config or {}))


def model_name(factory: Callable[[], Any]) -> str:
    """What to call the served model when the user did not say."""
    return getattr(factory, "name", None) or getattr(factory, "__name__", None) or type(factory).__name__


def _run_one(engine: Any, prompt: Any, output_type: Any) -> Any:
    try:
        return engine.run(prompt, output_type)
    except Exception as exc:  # noqa: BLE001 - recorded per row by the caller
        return exc


def run_batch(engine: Any, prompts: Sequence[Any], output_type: Any) -> list[Any]:
    """One Result (or the exception it raised) per prompt, in order; never raises for one bad prompt."""
    return run_each(engine, prompts, lambda p: _run_one(engine, p, output_type))


def run_each(engine: Any, items: Sequence[Any], fn: Callable[[Any], Any]) -> list[Any]:
    """`fn(item)` for every item, in order (fn runs one row on the engine and returns its outcome).

    A batching engine (one with `batch_config`, whose scheduler decodes concurrent calls together) gets every item
    at once, as `generate_many` feeds it; `run` is called rather than `generate_many` because a row needs the
    Result (raw text, finish reason, stats), not only the value. Other engines run the items in turn."""
    batch = getattr(engine, "batch_config", None)
    if batch is None or len(items) < 2:
        return [fn(item) for item in items]
    from concurrent.futures import ThreadPoolExecutor

    workers = min(len(items), batch.max_batch_size + max(1, min(batch.max_queue, batch.max_batch_size)))
    with ThreadPoolExecutor(workers, thread_name_prefix="specstruct-ray") as pool:
        return list(pool.map(fn, items))


def check_engine(engine: Any) -> None:
    """Raise when the engine can no longer serve: its scheduler was closed or its loop thread died (batching
    engines). Ray Serve calls this through the replica's `check_health` and replaces a replica that fails it."""
    scheduler = getattr(engine, "scheduler", None)
    problem = scheduler.problem() if hasattr(scheduler, "problem") else None
    if problem:
        raise RuntimeError(problem)
