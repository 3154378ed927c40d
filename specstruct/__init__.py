"""specstruct: guaranteed structured output from local transformers models, made fast by grammar-aware
speculative decoding.

Names load on first use (PEP 562), so `import specstruct` and the `specstruct --help` command stay cheap: torch
and transformers are imported when `SpecStruct` (or anything that needs them) is first touched."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_WHERE = {
    "SpecStruct": "api", "SpecConfig": "config", "BatchConfig": "config", "Result": "results", "Stats": "results",
    "DrafterStats": "results", "Chunk": "results", "Regex": "output_types", "Choice": "output_types",
    "Grammar": "output_types", "Code": "output_types", "pull": "models", "ToolReply": "tool_replies",
    "RawPrompt": "inputs",
    **{name: "errors" for name in (
        "SpecStructError", "ConstraintError", "IncompleteOutputError", "ValidationRetryError", "ModelNotFoundError",
        "IncompatibleDraftError", "PromptTooLongError", "InvalidPromptError", "InvalidParameterError",
        "MissingExtraError", "OverloadedError", "RequestTimeoutError", "EngineClosedError", "KVMemoryError")},
}
_SUBMODULES = {"api", "config", "errors", "results", "output_types", "streaming", "inputs", "extras", "testing",
               "aio", "chunks", "many", "tools", "tool_replies",
               "constraints", "decoding", "models", "bench", "cli", "serving"}
__all__ = list(_WHERE)
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        return importlib.import_module(f"specstruct.{name}")
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'specstruct' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"specstruct.{module}"), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


if TYPE_CHECKING:  # static type checkers and IDEs see ordinary imports
    from .api import SpecStruct
    from .config import BatchConfig, SpecConfig
    from .errors import (ConstraintError, EngineClosedError, IncompatibleDraftError, IncompleteOutputError, InvalidParameterError,
                         InvalidPromptError, MissingExtraError, ModelNotFoundError, PromptTooLongError,
                         OverloadedError, RequestTimeoutError, SpecStructError, ValidationRetryError, KVMemoryError)
    from .models import pull
    from .output_types import Choice, Code, Grammar, Regex
    from .results import Chunk, DrafterStats, Result, Stats
    from .inputs import RawPrompt
    from .tool_replies import ToolReply
