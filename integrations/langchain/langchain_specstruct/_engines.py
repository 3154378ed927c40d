"""Loaded engines, shared between model objects and guarded for concurrent use.

Building a `ChatSpecStruct` costs nothing: the models load on the first call, and every instance with the
same (model, draft, device, dtype) shares one loaded engine, so LangChain code that builds many model
objects (chains, `bind`, the standard test-suite's ~60 instances) loads the weights once.

Calls need no lock: every call is a request to the engine's scheduler, which batches concurrent ones.
Loading takes minutes, so it holds only its own key's lock: calls on engines already loaded, and loads of
other keys, go on meanwhile.
"""

from __future__ import annotations

import threading
from typing import Any, NamedTuple

_ENGINES: dict["EngineKey", Any] = {}
_LOADING: dict["EngineKey", threading.Lock] = {}  # one lock per key while it loads
_GUARD = threading.Lock()  # held only for dictionary updates, never while loading


class EngineKey(NamedTuple):
    model: str
    draft: str | None
    device: str
    dtype: str


def get_engine(key: EngineKey) -> Any:
    """The shared engine for `key`, loading it on first use (`specstruct.SpecStruct.from_pretrained`)."""
    engine = _ENGINES.get(key)
    if engine is not None:
        return engine
    with _GUARD:
        loading = _LOADING.setdefault(key, threading.Lock())
    with loading:  # a second caller for the same key waits here, then finds the engine loaded
        engine = _ENGINES.get(key)
        if engine is None:
            import specstruct as ss

            built = ss.EngineConfig(device=key.device, dtype=key.dtype)
            engine = ss.SpecStruct.from_pretrained(key.model, draft=key.draft, engine_config=built)
            with _GUARD:
                _ENGINES[key] = engine
                _LOADING.pop(key, None)
    return engine


def clear_engines() -> None:
    """Forget every loaded engine (frees their memory once no model object refers to them)."""
    with _GUARD:
        _ENGINES.clear()
        _LOADING.clear()


def engine_name(engine: Any, fallback: str) -> str:
    """A readable model name for traces and `response_metadata["model_name"]`."""
    name = getattr(engine, "model_name", None)
    if isinstance(name, str) and name:
        return name
    tok = getattr(engine, "tokenizer", None)
    return getattr(tok, "name_or_path", None) or fallback
