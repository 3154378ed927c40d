"""How a Ray worker gets its engine, and how it feeds the engine a whole batch.

A Ray actor or Serve replica is started from a pickled description, so the engine is described by a *factory*: a
picklable callable that returns a SpecStruct. `Pretrained` is the one users need (a model name, folder or hub id, an
optional draft and SpecConfig keys); any other module-level function or class instance returning a SpecStruct works
too (tests pass one that builds tiny offline models)."""

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

    def __call__(self):
        from specstruct.api import SpecStruct

        return SpecStruct.from_pretrained(self.model, draft=self.draft, decoding_params=dict(self.config))

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


def run_batch(engine: Any, prompts: Sequence[Any], output_type: Any) -> list[Any]:
    """One Result (or the exception it raised) per prompt, in order; never raises for one bad prompt.

    Uses the engine's batched `generate_many` when it has one (all prompts decode concurrently), else `run` in turn.
    """
    many = getattr(engine, "generate_many", None)
    if many is not None:
        return list(many(list(prompts), output_type, progress=False, return_exceptions=True))
    out: list[Any] = []
    for prompt in prompts:
        try:
            out.append(engine.run(prompt, output_type))
        except Exception as exc:  # noqa: BLE001 - recorded per row by the caller
            out.append(exc)
    return out
