"""The one call signature: run, stream, arun and astream take the same keywords (run's); a keyword none of them
names is refused before anything runs, with the config that takes it where it is a SpecConfig or EngineConfig key."""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable, TypeVar

from specstruct.config import config_hint


def call_keywords(engine: Any) -> set[str]:
    """The keywords every call takes (run's, shared by stream, arun and astream)."""
    return {name for name, p in inspect.signature(engine.run).parameters.items() if p.kind is p.KEYWORD_ONLY}


def refuse_unknown(name: str, kwargs: dict[str, Any], known: set[str], listing: str = "") -> None:
    """TypeError for the keywords of `kwargs` outside `known`, naming them (and `listing`: what is taken)."""
    unknown = sorted(set(kwargs) - known)
    if unknown:
        raise TypeError(f"{name}() got unexpected keyword arguments {unknown}{listing}{config_hint(unknown)}")


F = TypeVar("F", bound=Callable[..., Any])


def checked_keywords(fn: F) -> F:
    """run / stream / arun / astream take the decoding keys they name; another SpecConfig key is refused with the
    call that passes it (`config={...}`), not Python's bare "unexpected keyword argument". The wrapper is what
    `fn` is (a function, a generator, a coroutine or an async generator function), so introspection still tells."""
    named = set(inspect.signature(fn).parameters)

    def check(kwargs: dict[str, Any]) -> None:
        refuse_unknown(fn.__name__, kwargs, named)

    if inspect.isasyncgenfunction(fn):
        @functools.wraps(fn)
        async def stream(*args: Any, **kwargs: Any) -> Any:
            check(kwargs)
            inner = fn(*args, **kwargs)
            try:
                async for item in inner:
                    yield item
            finally:
                await inner.aclose()  # closing this stream closes (and cancels) the inner one now
        return stream  # type: ignore[return-value]
    if inspect.isgeneratorfunction(fn):
        @functools.wraps(fn)
        def chunks(*args: Any, **kwargs: Any) -> Any:
            check(kwargs)
            return (yield from fn(*args, **kwargs))  # closing this one closes (and cancels) the inner one
        return chunks  # type: ignore[return-value]
    if inspect.iscoroutinefunction(fn):
        @functools.wraps(fn)
        async def coroutine(*args: Any, **kwargs: Any) -> Any:
            check(kwargs)
            return await fn(*args, **kwargs)
        return coroutine  # type: ignore[return-value]

    @functools.wraps(fn)
    def checked(*args: Any, **kwargs: Any) -> Any:
        check(kwargs)
        return fn(*args, **kwargs)
    return checked  # type: ignore[return-value]
